"""One hyperparameter-tuning job under FLUID: the loop of thesis Fig. 3.4 as three calls.

The tuning algorithm (2a) submits TrialGroups, FLUID (2b) places them, results (3b) flow back. A Prefect
flow (or the simulator) owns the clock and the trial processes and calls:

* ``start(now)`` once -> ``Step`` (launch ``step.starts`` on their GPU slices);
* ``report_progress(trial_id, iterations_done)`` as trials finish iterations (DynamicFluid's remaining work);
* ``report_complete(now, trial_id, score)`` when a trial ends -> ``Step`` (new starts; ``step.resizes`` to apply
  at each trial's next iteration boundary: checkpoint, relaunch on the new placement; ``step.stops``).

``now`` is the world's clock (the simulator's virtual time, the flow's wall clock since it started).
``profile`` (one call per TrialGroup, so a profiler can measure the group's trials side by side) attaches
measured ``iter_time_s``/``alpha``/``beta`` to each trial before FLUID sees it (§3.5:
"FLUID thus uses a small fraction of resources to profile current trials and reuse the result throughout the
whole tuning session"); the flow's profiler is ``tasks.fluid.profiling``, the simulator's ``Workload.profile``.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from gpu.schedulers.fluid.algorithms import Trial, TrialGroup
from gpu.schedulers.fluid.controller import TrialPlacement, Step
from gpu.schedulers.fluid.tuning.base import TuningAlgorithm


class Executor(Protocol):
    """What FluidExecutor and the FIFO baseline both offer (a ``gpu.contract.Controller`` plus these)."""

    system: str
    policy: str
    hooks: tuple[str, ...]

    @property
    def running(self) -> dict[str, TrialPlacement]: ...

    def open_slots(self) -> int: ...

    def idle(self) -> bool: ...

    @property
    def group_makespans(self) -> dict[str, float]: ...

    def on_group(self, now: float, group: TrialGroup) -> Step: ...

    def on_progress(self, trial_id: str, iterations_done: float) -> None: ...

    def on_trial_done(self, now: float, trial_id: str) -> Step: ...

    def rebalance(self) -> Step: ...


class TuningSession:
    """Couples a tuning algorithm (what to train) with an executor (how it runs)."""

    def __init__(self, algorithm: TuningAlgorithm, executor: Executor,
                 profile: Callable[[Sequence[Trial]], Sequence[Trial]] | None = None):
        self.algorithm = algorithm
        self.executor = executor
        self.profile = profile or (lambda trials: trials)
        self.trials: dict[str, Trial] = {}
        self.groups = 0

    def start(self, now: float = 0.0) -> Step:
        """Hand out the first TrialGroups and place them."""
        return self._pump(now)

    def report_progress(self, trial_id: str, iterations_done: float) -> None:
        self.executor.on_progress(trial_id, iterations_done)

    def report_complete(self, now: float, trial_id: str, score: float) -> Step:
        """Free the trial's slots, tell the algorithm, place new work, then let DynamicFluid resize."""
        step = self.executor.on_trial_done(now, trial_id)
        self.algorithm.on_trial_complete(trial_id, score)
        return step.then(self._pump(now))

    def trial(self, trial_id: str) -> Trial:
        """The profiled trial (config, budget, checkpoint to resume from)."""
        return self.trials[trial_id]

    @property
    def finished(self) -> bool:
        return self.algorithm.finished and self.executor.idle()

    def _pump(self, now: float) -> Step:
        step = Step()
        while (group := self.algorithm.suggest(self.executor.open_slots())) is not None:
            group = TrialGroup(group.group_id, tuple(self.profile(group.trials)))
            self.trials.update((t.trial_id, t) for t in group.trials)
            self.groups += 1
            step = step.then(self.executor.on_group(now, group))
        return step.then(self.executor.rebalance())
