"""The ESCHER flow's data-parallel gang (Bhardwaj, ESCHER, thesis §4.4e, AppSpace) with the real clock.

``run_gang`` is the gang's world: it holds one GPU *ghost* per member, backs a unit of ``gang-<g>`` by each
(``lease_resource``, P4), launches the members on ``{gang-<g>: 1}`` and ends the gang, doing whatever
``AppSpaceGang`` decides; the rollback on a timeout and the teardown at the end are the controller's
(``gpu.schedulers.escher.gang``), never written here.

The members meet in a gloo all-reduce at a ``Rendezvous`` (``tasks/runtime/rendezvous.py``, shared with FLUID's
trials): a member that fails before the others joined (its task's end, or a ghost's lease lost) has the flow abort
the rendezvous, and one that fails mid-gang destroys its process group, so its peers end at once either way.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import task
from prefect.futures import wait

from gpu.errors import AllocationTimeout
from gpu.placement import ResourceRequest
from gpu.schedulers.escher.api import Escher, NodeSpec
from gpu.schedulers.escher.gang import AppSpaceGang, Gang, GangStep
from gpu.schedulers.escher.primitives import anti_affinity
from tasks.escher.jobs import RENDEZVOUS_TIMEOUT, checksum, linear_model, train, where
from tasks.runtime.rendezvous import Rendezvous, abort_when_failed, abort_when_lost
from tasks.runtime.requests import gpu_options


@task
def gang_member(rank: int, world: int, steps: int, rendezvous: Rendezvous) -> dict:
    """One data-parallel worker: its shard of digits, gradients summed with every other member's each step by a
    gloo all-reduce (it blocks until all ``world`` members have joined, so the job only finishes if the whole gang
    runs at once). A failure here destroys the process group, so the peers' all-reduce fails at once."""
    started = time.time()
    with rendezvous.group(rank) as gang:
        joined = time.time()

        def average(grad):
            gang.allreduce(grad)
            return grad / world

        model = linear_model(3)
        losses = train(model, steps, rank, world, average)
    return {"task": f"member-{rank}", "checksum": checksum(model), "loss": losses[-1], "joined": joined,
            **where(started)}


class _GangWorld:
    """What the flow does for one AppSpace gang: the ghosts it holds and the ``GangStep``s it applies."""

    def __init__(self, ledger, esl: Escher, controller: AppSpaceGang):
        self.ledger, self.esl, self.controller = ledger, esl, controller
        self.ghosts: list = []
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start

    def apply(self, step: GangStep) -> GangStep:
        """The controller's ``gang-<g>`` deletions, then (rollback) the attempt's ghosts released."""
        self.esl.apply(step.actions)
        if step.rollback:
            self._release()
        return step

    def _release(self) -> None:
        for ghost in self.ghosts:
            self.ledger.release(ghost.lease_id)
        self.ghosts = []

    def hold_ghosts(self) -> GangStep:
        """Ghosts until every one runs (the launch step); a timeout rolls back, backs off and retries."""
        gang = self.controller.gang
        step = self.controller.on_arrival(self.now())
        while True:
            try:
                for i in step.submit:
                    left = None if step.wake_at is None else max(0.0, step.wake_at - self.now())
                    ghost = self.ledger.allocate(gang.ghost(i), timeout=left)
                    self.ghosts.append(ghost)
                    # the decided gang-<g> unit, backed by the ghost so the member inherits its devices (P4)
                    self.ledger.lease_resource(ghost.lease_id, gang.resource, 1)
                    decided = self.controller.on_ghost_started(self.now(), i, ghost.node)
                return decided
            except AllocationTimeout:
                back_off = self.apply(self.controller.on_timer(self.now()))
                time.sleep(max(0.0, back_off.wake_at - self.now()))  # the ESL's back-off timer
                step = self.controller.on_retry(self.now())

    def finish(self) -> None:
        """The gang is over (run, failed or cancelled): the controller's teardown, every ghost released."""
        self.esl.apply(self.controller.on_finished(self.now()).actions)
        self._release()


def run_members(launch: tuple[ResourceRequest, ...], steps: int, rendezvous: Rendezvous) -> list[dict]:
    """Submit the members; the first that fails aborts the rendezvous. Returns once every member has ended (also
    when it raises): their results, or the first failure raised."""
    futures = []
    for i, member in enumerate(launch):
        with gpu_options(resources=dict(member.resources)):
            futures.append(gang_member.with_options(name=member.label).submit(i, len(launch), steps, rendezvous))
        abort_when_failed(rendezvous, i, futures[-1])
    try:
        wait(futures)
    except BaseException:  # the flow itself stops: members still at the rendezvous need not wait for the others
        rendezvous.abort("the flow running the gang stopped")
        wait(futures)  # the ghosts go only once no member runs on their devices
        raise
    return [f.result() for f in futures]


def run_gang(ledger, esl: Escher, size: int, steps: int, timeout_s: float, seed: int, workdir: str) -> dict[str, Any]:
    """AppSpace gang (§4.4e): ghosts spread by anti-affinity → ``gang-<g>`` per ghost's node → members, who train
    one data-parallel model. ``gang-<g>``, the ghosts and ``anti-gang-ghosts`` are gone when it returns or raises."""
    spread = anti_affinity(esl, "gang-ghosts")
    gang = Gang("dp", tuple(ResourceRequest(gpus=1, resources=spread) for _ in range(size)))
    world = _GangWorld(ledger, esl, AppSpaceGang(gang, timeout=timeout_s, seed=seed))
    rendezvous = Rendezvous.create(workdir, "gang-", size, RENDEZVOUS_TIMEOUT)
    try:
        decided = world.hold_ghosts()
        latency = world.now()
        ghosts = [{"node": g.node, "devices": list(g.devices), "lease": g.lease_id} for g in world.ghosts]
        abort_when_lost(rendezvous, ledger, world.ghosts)
        members = run_members(decided.launch, steps, rendezvous)
    finally:
        world.finish()
        esl.delete_resource("anti-gang-ghosts", NodeSpec())
        rendezvous.remove()
    attempts = world.controller.attempts
    return {"members": members, "tasks": members, "ghosts": [{k: g[k] for k in ("node", "devices")} for g in ghosts],
            "attempts": attempts, "gang_latency_s": latency,
            "metrics": {"gang_latency_s": latency, "gang_attempts": attempts, "gang_size": size},
            "actions": [{"call": "lease_resource", "name": gang.resource, "capacity": 1.0, "node": g["node"],
                         "by": f"ghost {g['lease']}"} for g in ghosts]}
