"""Fig. 4.7 in simulation: gang-scheduling latency of AppSpace, LibSpace and FrameSpace.

Several applications submit gangs (``size`` one-CPU members each, Poisson arrivals) to a cluster of
``nodes`` x ``cpus`` (the paper: 32 nodes, 256 CPUs; Ray's decentralised matching, modelled by a
backfilling scheduler: any task that fits runs). A gang's latency runs from its request to the moment
every member runs. The world below only carries out each design's ``GangStep``s
(``gpu.schedulers.escher.gang``): ghosts are ordinary tasks, the serializer is a capacity-1
resource, FrameSpace is ``grant_all``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpu.devices import simulated_nodes
from gpu.ledger import Lease
from gpu.placement import FifoBestFit, ResourceRequest
from gpu.schedulers.escher.gang import GANG_DESIGNS, AppSpaceGang, FrameSpaceGang, Gang, GangStep, LibSpaceGang
from gpu.sim.escher.world import Timing, World


@dataclass(frozen=True)
class GangLoad:
    nodes: int = 8
    cpus: int = 8
    gangs: int = 200
    sizes: tuple[int, ...] = (8, 16, 24, 32)
    arrival_rate: float = 10.0      # gangs per second over all applications
    run_s: float = 0.1              # how long members run once the gang is up
    timeout: float = 0.3            # AppSpace ghost timeout
    backoff: float = 0.02           # AppSpace back-off base (doubling, jittered)


@dataclass
class _Run:
    """The world's side of one gang: its tickets, leases and clock readings."""

    ctrl: AppSpaceGang | LibSpaceGang | FrameSpaceGang
    arrived: float
    attempt: int = 0
    tickets: dict[int, int] = field(default_factory=dict)       # ghost index -> ticket
    ghosts: dict[int, str] = field(default_factory=dict)        # ghost index -> lease id
    lock: str | None = None
    running: int = 0
    latency: float | None = None


class GangWorld:
    """Carries out one design's decisions for a stream of gangs."""

    def __init__(self, design: str, load: GangLoad, timing: Timing, seed: int):
        self.design, self.load = design, load
        self.world = World(simulated_nodes("0x1GiB", load.nodes, cpus=load.cpus), FifoBestFit(backfill=True),
                           timing, seed)
        self.rng = np.random.default_rng(seed + 1)
        self.runs: list[_Run] = []
        self._frame_waiting: list[_Run] = []
        if design == "libspace":
            self.world.esl.apply(LibSpaceGang.setup("node0"))
        if design == "framespace":
            self.world.on_release.append(self._retry_frames)

    def run(self) -> list[float]:
        t = 0.0
        for i in range(self.load.gangs):
            t += float(self.rng.exponential(1 / self.load.arrival_rate))
            size = int(self.rng.choice(self.load.sizes))
            gang = Gang(f"g{i}", tuple(ResourceRequest(cpus=1) for _ in range(size)))
            self.world.loop.at(t, lambda gang=gang: self._arrive(gang))
        self.world.loop.run()
        return [r.latency for r in self.runs if r.latency is not None]

    def _arrive(self, gang: Gang) -> None:
        cls = GANG_DESIGNS[self.design]
        ctrl = cls(gang, timeout=self.load.timeout, backoff=self.load.backoff, seed=len(self.runs)) \
            if cls is AppSpaceGang else cls(gang)
        run = _Run(ctrl, self.world.now)
        self.runs.append(run)
        self._do(run, ctrl.on_arrival(self.world.now))

    # -- carrying out a step ---------------------------------------------------------------------
    def _do(self, run: _Run, step: GangStep) -> None:
        w = self.world
        if step.rollback:
            self._rollback(run)
            w.loop.at(step.wake_at, lambda: self._do(run, run.ctrl.on_retry(w.now)))
        elif step.wake_at is not None:
            attempt = run.attempt
            w.loop.at(step.wake_at, lambda: self._timer(run, attempt))
        if step.lock:
            w.submit(LibSpaceGang.lock_request(run.ctrl.gang.gang_id),
                     lambda p: w.loop.after(w.latency(), lambda: self._locked(run, p)))
        for i in step.submit:
            self._submit_ghost(run, i)
        if step.grant_all:
            self._try_frame(run)
        w.apply(step.actions, then=(lambda: self._launch(run, step)) if step.launch else None)
        if step.unlock and run.lock:
            w.release(run.lock)

    def _submit_ghost(self, run: _Run, i: int) -> None:
        w, attempt = self.world, run.attempt

        def granted(p: Lease) -> None:
            w.loop.after(w.latency(), lambda: started(p))

        def started(p: Lease) -> None:
            if attempt != run.attempt:
                w.release(p.lease_id)                   # a ghost of a rolled-back attempt ends at once
                return
            run.ghosts[i] = p.lease_id
            self._do(run, run.ctrl.on_ghost_started(w.now, i, p.node))

        run.tickets[i] = w.submit(run.ctrl.gang.ghost(i), granted)

    def _rollback(self, run: _Run) -> None:
        for ticket in run.tickets.values():
            self.world.cancel(ticket)
        for lease in run.ghosts.values():
            self.world.release(lease)
        run.tickets.clear()
        run.ghosts.clear()
        run.attempt += 1

    def _timer(self, run: _Run, attempt: int) -> None:
        """AppSpace's timeout: roll back unless the gang is up (or this timer's attempt is over)."""
        if attempt == run.attempt and not run.ctrl.done:
            self._do(run, run.ctrl.on_timer(self.world.now))

    def _locked(self, run: _Run, lock: Lease) -> None:
        run.lock = lock.lease_id
        self._do(run, run.ctrl.on_locked(self.world.now))

    def _try_frame(self, run: _Run) -> None:
        placements = self.world.ledger.grant_all(list(run.ctrl.gang.members))
        if placements is None:
            if run not in self._frame_waiting:
                self._frame_waiting.append(run)
            return
        run.ghosts = {i: p.lease_id for i, p in enumerate(placements)}
        nodes = tuple(p.node for p in placements)
        self._do(run, run.ctrl.on_granted(self.world.now, nodes))

    def _retry_frames(self) -> None:
        waiting, self._frame_waiting = self._frame_waiting, []
        for run in waiting:
            self._try_frame(run)

    def _launch(self, run: _Run, step: GangStep) -> None:
        w = self.world

        def started(p: Lease) -> None:
            run.running += 1
            if run.running == len(step.launch):
                run.latency = w.now - run.arrived

        def ended(p: Lease) -> None:
            run.running -= 1
            if run.running == 0:
                for lease in run.ghosts.values():        # ghosts exit with the gang, freeing the bundles
                    w.release(lease)
                run.ghosts.clear()
                w.apply(run.ctrl.on_finished(w.now).actions)

        for member in step.launch:
            w.run_task(member, self.load.run_s, on_start=started, on_end=ended)


def gang_latencies(load: GangLoad, timing: Timing, seed: int) -> dict[str, list[float]]:
    """Latency (s) of every gang under each design, same arrivals for all three."""
    return {design: GangWorld(design, load, timing, seed).run() for design in GANG_DESIGNS}
