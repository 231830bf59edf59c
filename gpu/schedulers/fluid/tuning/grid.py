"""Grid and random search: every trial in ONE TrialGroup with the full budget (thesis §3.3.2).

Variants come from Ray Tune's variant generator (``space.variants``). ``FixedTrials`` submits a
given list (e.g. the toy example of Fig. 3.5: budgets 4, 4, 12, 30 s).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import Trial, TrialGroup
from gpu.schedulers.fluid.tuning.base import TuningAlgorithm, check_budget, check_count
from gpu.schedulers.fluid.tuning.space import Space, validate_space, variants


class _OneGroup(TuningAlgorithm):
    """Hands out all its trials once, then waits for them."""

    def __init__(self, trials: list[Trial]):
        super().__init__()
        self._todo = trials

    def suggest(self, slots: int) -> TrialGroup | None:
        if not self._todo:
            return None
        trials, self._todo = self._todo, []
        return self._group(trials)

    @property
    def finished(self) -> bool:
        return not self._todo and not self.pending


class GridSearch(_OneGroup):
    """Every point of the Grid axes (random axes drawn once per point), each trained for ``budget``."""

    name = "grid"

    def __init__(self, space: Space, budget: float, num_samples: int = 1, seed: int = 0):
        configs = variants(validate_space(space), check_count(num_samples, "num_samples"), np.random.default_rng(seed))
        b = check_budget(budget, "budget")
        super().__init__([Trial(f"c{i:04d}@0", b, cfg) for i, cfg in enumerate(configs)])


class RandomSearch(GridSearch):
    """``num_samples`` random configs (times the Grid axes, as in Ray Tune), each trained for ``budget``."""

    name = "random"


class FixedTrials(_OneGroup):
    """An explicit list of ``(trial_id, budget, config)`` as one TrialGroup."""

    name = "trials"

    def __init__(self, trials: Sequence[tuple[str, float, dict[str, Any]]]):
        if not trials:
            raise ConfigError("trials", list(trials), "needs at least one trial")
        super().__init__([Trial(tid, check_budget(b, f"trials.{tid}.budget"), cfg) for tid, b, cfg in trials])
