"""The executions FLUID is compared with (thesis §3.2.2, §3.6.1): one trial per GPU.

``FifoExecutor`` is Ray Tune's default execution: every trial gets exactly one whole GPU, trials wait in a
FIFO queue in submission order, widths never change. Driven by a synchronous algorithm it is the "one trial
per worker, FIFO queue" baseline; driven by an asynchronous one (ASHA, BOHB) through ``open_slots`` — one
new trial per idle GPU — it is the "fully asynchronous launch-on-idle" baseline. The same
``gpu.contract.Controller`` as ``FluidExecutor`` (policy ``"fifo"``), so the simulator and a flow swap the two.
"""

from __future__ import annotations

from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import Trial, TrialGroup
from gpu.schedulers.fluid.controller import GroupClock, TrialPlacement, PlacementBook, Step


class FifoExecutor:
    """One trial per GPU, first come first served; ``open_slots`` = idle GPUs (launch-on-idle)."""

    system = "fluid"
    policy = "fifo"
    hooks = ("on_group", "on_trial_done")

    def __init__(self, gpus: list[int]):
        if not gpus:
            raise ConfigError("gpus", gpus, "need at least one GPU")
        self.book = PlacementBook(list(gpus))
        self.clock = GroupClock()
        self.trials: dict[str, Trial] = {}
        self.group_of: dict[str, str] = {}
        self.queue: list[str] = []

    @property
    def running(self) -> dict[str, TrialPlacement]:
        return dict(self.book.running)

    @property
    def queued(self) -> int:
        return len(self.queue)

    def open_slots(self) -> int:
        return max(0, len(self.book.idle()) - len(self.queue))

    def idle(self) -> bool:
        return not self.book.running and not self.queue

    @property
    def group_makespans(self) -> dict[str, float]:
        return dict(self.clock.makespans)

    def on_group(self, now: float, group: TrialGroup) -> Step:
        if group.group_id in self.clock.arrived:
            raise ConfigError("group_id", group.group_id, "already submitted")
        for t in group.trials:
            if t.trial_id in self.trials:
                raise ConfigError("trial_id", t.trial_id, "already submitted")
        self.clock.tick(now)
        self.clock.start(group.group_id, len(group.trials))
        for t in group.trials:
            self.trials[t.trial_id] = t
            self.group_of[t.trial_id] = group.group_id
            self.queue.append(t.trial_id)
        return self._drain()

    def on_progress(self, trial_id: str, iterations_done: float) -> None:
        if trial_id not in self.trials:
            raise ConfigError("trial_id", trial_id, "unknown to this executor")

    def on_trial_done(self, now: float, trial_id: str) -> Step:
        self._forget(now, trial_id)
        return self._drain()

    def terminate(self, now: float, trial_id: str) -> Step:
        was_running = trial_id in self.book.running
        self._forget(now, trial_id)
        return Step(stops=(trial_id,) if was_running else ()).then(self._drain())

    def rebalance(self) -> Step:
        return Step()

    def _forget(self, now: float, trial_id: str) -> None:
        if trial_id not in self.trials:
            raise ConfigError("trial_id", trial_id, "unknown to this executor")
        self.clock.tick(now)
        if trial_id in self.book.running:
            self.book.free(trial_id)
        if trial_id in self.queue:
            self.queue.remove(trial_id)
        del self.trials[trial_id]
        self.clock.finish(self.group_of.pop(trial_id))

    def _drain(self) -> Step:
        starts = []
        for g in self.book.idle():
            if not self.queue:
                break
            starts.append(self.book.place(self.queue.pop(0), 1.0, (g,)))
        return Step(tuple(starts))
