"""Where a gang of data-parallel workers meets, and how one lost member ends the others at once.

A gang is all-or-none: ESCHER's AppSpace gang (Bhardwaj, ESCHER, thesis §4.4e) and EscherTune's trials, "wrapped
in a ghost task that ensures gang scheduling" (§4.5, Fig. 4.6c), run every member or none. Their members meet in
a gloo process group over a ``torch.distributed.FileStore``, so a lost member must not leave the others blocked
for the collective's patience (``Rendezvous.timeout``, a minute or two):

* a member that fails or is killed before the others joined: the launcher sees its task end in failure
  (``abort_when_failed``) or its ghost's lease taken away (``abort_when_lost``, ``ledger.watch``) and aborts the
  ``Rendezvous``; members waiting at its barrier fail at once with ``GangAborted``;
* a member that fails mid-gang leaves ``Rendezvous.group`` with its process group destroyed, and one killed
  (``kill -9``) has its sockets closed by the OS: either way its peers' next collective fails at once with a
  connection error (and they destroy theirs in turn, so a ring of three or more unwinds too).

Used by ``tasks/escher/gang.py`` (ESCHER's gang) and ``tasks/fluid/escher.py`` (FLUID's trials across nodes).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Sequence

from gpu.errors import GpuflowsError

ABORT = "abort"
# The launcher's ``abort`` (run by a member's future callback, in a runner thread) and ``remove`` (the flow, once every
# member ended) race: a folder removed between abort's check and its store opening the file makes torch's FileStore
# retry the open for its default 300 s, holding the GIL, so the whole flow process froze for five minutes.
_LAUNCHER = threading.Lock()


class GangAborted(GpuflowsError):
    """A member's peer was lost before the gang met: the member gives up instead of waiting for it."""


class GangGroup:
    """A member's gloo process group. ``close`` drops the group's one reference, which destroys it and closes its
    connections (gloo's ``abort()`` leaves them open in torch 2.13), even while an error's traceback keeps the
    member's frames, and this object, alive."""

    def __init__(self, store: Any, rank: int, world: int, timeout: timedelta):
        import torch.distributed as dist

        self.store, self.rank, self.world = store, rank, world
        self._group = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world, timeout)

    def allreduce(self, tensor) -> None:
        """Sum ``tensor`` in place over the gang."""
        self._group.allreduce([tensor]).wait()

    def broadcast(self, tensor) -> None:
        """Overwrite ``tensor`` in place with rank 0's."""
        self._group.broadcast([tensor]).wait()

    def close(self) -> None:
        self._group = None


@dataclass(frozen=True)
class Rendezvous:
    """Where a gang's ``world`` members meet: a barrier in a ``FileStore`` at ``path`` that the launcher can abort.

    A member sets ``joined-<rank>`` and waits for every rank's key. ``abort`` writes the reason and then every
    rank's key, so the waiting members wake at once and find the reason instead of a gang. ``timeout`` is the
    patience with a slow, live peer (the barrier's and every collective's). Picklable: process-mode members get it
    as a task parameter."""

    path: str
    world: int
    timeout: timedelta

    @classmethod
    def create(cls, parent: str, prefix: str, world: int, timeout: timedelta) -> Rendezvous:
        """A fresh rendezvous in its own folder under ``parent`` (``remove`` deletes it)."""
        return cls(os.path.join(tempfile.mkdtemp(prefix=prefix, dir=parent), "store"), world, timeout)

    def store(self):
        """The gang's store. Raises ``GangAborted`` once the folder is removed (the gang has ended): torch's
        FileStore would retry opening a file in a missing folder for 300 s, holding the GIL."""
        import torch.distributed as dist

        if not os.path.isdir(os.path.dirname(self.path)):
            raise GangAborted(f"the rendezvous {self.path} was removed: its gang has ended")
        store = dist.FileStore(self.path, -1)  # -1: the file outlives any one user; ``remove`` deletes its folder
        store.set_timeout(self.timeout)
        return store

    def _ranks(self) -> list[str]:
        return [f"joined-{r}" for r in range(self.world)]

    def join(self, rank: int):
        """Wait until every member joined; the store the gang's process group uses. Raises ``GangAborted``."""
        store = self.store()
        store.set(f"joined-{rank}", "1")
        store.wait(self._ranks(), self.timeout)
        if store.check([ABORT]):
            raise GangAborted(f"gang member {rank}: {store.get(ABORT).decode()}")
        return store

    @contextmanager
    def group(self, rank: int) -> Iterator[GangGroup]:
        """Join, then the member's process group; destroyed if the member fails inside, so its peers end at once."""
        gang = GangGroup(self.join(rank), rank, self.world, self.timeout)
        try:
            yield gang
        except BaseException:
            gang.close()
            raise

    def abort(self, reason: str) -> None:
        """Wake every waiting member with ``reason`` (members already past the barrier are not affected). A no-op
        once the folder is removed: every member has ended."""
        with _LAUNCHER:
            if not os.path.isdir(os.path.dirname(self.path)):
                return
            store = self.store()
            store.set(ABORT, reason)
            for key in self._ranks():
                store.set(key, "1")

    def remove(self) -> None:
        """Delete the rendezvous folder (call once every member has ended; never while an ``abort`` writes to it)."""
        with _LAUNCHER:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


# -- the launching side ------------------------------------------------------------------------------------------
def abort_when_failed(rendezvous: Rendezvous, rank: int, future) -> None:
    """Member ``rank``'s task (a Prefect future) ending in any state but Completed aborts the rendezvous."""

    def ended(done) -> None:
        done.wait()  # done already: this only records its final state
        if not done.state.is_completed():
            rendezvous.abort(f"member {rank} ended {done.state.name}: {done.state.message}")

    future.add_done_callback(ended)


def abort_when_lost(rendezvous: Rendezvous, ledger: Any, leases: Sequence[Any]) -> None:
    """A ghost's lease taken away by the ledger takes its member's devices: the gang cannot meet."""
    for lease in leases:
        ledger.watch(lease.lease_id, lambda reason: rendezvous.abort(f"a ghost was lost: {reason}"))
