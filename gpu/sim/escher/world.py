"""The simulated world ESCHER's ESLs run in: an ``EventLoop`` clock, a ``SimLedger`` scheduler, tasks.

The world does what a cluster does and nothing more (ESCHER §4.3: queuing, node selection,
allocation): it queues requests on the ledger, starts a granted task after a scheduling latency,
ends it after its duration and releases its lease, and applies ``set_resource`` calls after a
propagation delay (the call is asynchronous, §4.3; Fig. 4.8a puts it near 1 ms). ESLs are the objects
of ``gpu.schedulers.escher.api*``, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from gpu.devices import PoolSpec
from gpu.ledger import Lease
from gpu.placement import PlacementPolicy, ResourceRequest
from gpu.schedulers.escher.api import Actions, Escher
from gpu.sim.escher.ledger import SimLedger
from gpu.sim.events import EventLoop


@dataclass(frozen=True)
class Timing:
    """The world's latencies (seconds): a grant to a running task (lognormal around ``schedule``), and
    ``set_resource`` propagation."""

    schedule: float = 0.005
    schedule_sigma: float = 0.3
    set_resource: float = 0.001


class World:
    """Clock + scheduler + the tasks running on it."""

    def __init__(self, spec: PoolSpec, policy: PlacementPolicy | None, timing: Timing, seed: int):
        self.loop = EventLoop()
        self.timing = timing
        self.rng = np.random.default_rng(seed)
        self.ledger = SimLedger(spec, policy, on_grant=self._granted)
        self.esl = Escher(self.ledger)
        self._waiting: dict[int, Callable[[Lease], None]] = {}
        self.on_release: list[Callable[[], None]] = []

    @property
    def now(self) -> float:
        return self.loop.now

    def latency(self) -> float:
        """One scheduling latency draw (grant -> the task's code runs)."""
        t = self.timing
        return float(t.schedule * self.rng.lognormal(-t.schedule_sigma ** 2 / 2, t.schedule_sigma))

    def apply(self, actions: Actions, then: Callable[[], None] | None = None) -> None:
        """Apply an ESL decision once ``set_resource`` has propagated, then call ``then``."""
        def done() -> None:
            self.esl.apply(actions)
            if then is not None:
                then()

        if actions:
            self.loop.after(self.timing.set_resource, done)
        elif then is not None:
            then()

    def submit(self, request: ResourceRequest, on_grant: Callable[[Lease], None]) -> int:
        """Queue ``request``; ``on_grant(placement)`` when the scheduler grants it (at once if it fits)."""
        ticket = self.ledger.submit(request)
        placement = self.ledger.try_grant(ticket)
        if placement is not None:
            on_grant(placement)
        else:
            self._waiting[ticket] = on_grant
        return ticket

    def cancel(self, ticket: int) -> None:
        self._waiting.pop(ticket, None)
        self.ledger.cancel(ticket)

    def release(self, lease_id: str) -> None:
        if self.ledger.release(lease_id):
            for callback in list(self.on_release):
                callback()

    def _granted(self, ticket: int, placement: Lease) -> None:
        callback = self._waiting.pop(ticket, None)
        if callback is not None:
            self.ledger.try_grant(ticket)
            callback(placement)

    def run_task(self, request: ResourceRequest, duration: float | Callable[[Lease], float],
                 on_start: Callable[[Lease], None] | None = None,
                 on_end: Callable[[Lease], None] | None = None) -> int:
        """Queue a task: it starts a scheduling latency after its grant, runs ``duration`` (or
        ``duration(placement)``), then frees its lease."""
        def granted(p: Lease) -> None:
            self.loop.after(self.latency(), lambda: started(p))

        def started(p: Lease) -> None:
            if on_start is not None:
                on_start(p)
            d = duration(p) if callable(duration) else duration
            self.loop.after(d, lambda: ended(p))

        def ended(p: Lease) -> None:
            self.release(p.lease_id)
            if on_end is not None:
                on_end(p)

        return self.submit(request, granted)
