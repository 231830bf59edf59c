"""Population-based training (Jaderberg et al., 2017), generation by generation: one TrialGroup each.

A population of ``population`` members trains ``interval`` iterations per generation. After a generation,
the worst ``quantile`` of members exploit the best ``quantile`` (copy their checkpoint and config) and
explore (each continuous hyperparameter multiplied by 0.8 or 1.2 within bounds; each categorical resampled
with probability ``resample_probability``). The thesis notes PBT keeps a constant number of running trials,
so FLUID helps little except by packing more members (§3.6.2).

Bookkeeping is ours: Ray Tune's ``PopulationBasedTraining`` is an asynchronous scheduler that exploits
through the ``TuneController`` on each reported result; it does not form generations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import Trial, TrialGroup
from gpu.schedulers.fluid.tuning.base import TuningAlgorithm, check_budget, check_count
from gpu.schedulers.fluid.tuning.space import Choice, Grid, LogUniform, Space, Uniform, sample, validate_space


class PBT(TuningAlgorithm):
    """Synchronous PBT: ``generations`` TrialGroups of ``population`` members, exploit/explore in between."""

    name = "pbt"

    def __init__(self, space: Space, population: int, interval: float, generations: int, quantile: float = 0.25,
                 resample_probability: float = 0.25, seed: int = 0):
        super().__init__()
        self.space = validate_space(space)
        self.population = check_count(population, "population", 2)
        self.interval = check_budget(interval, "interval")
        self.generations = check_count(generations, "generations")
        if not 0 < quantile <= 0.5:
            raise ConfigError("quantile", quantile, "must be in (0, 0.5]")
        self.quantile, self.resample_probability = quantile, resample_probability
        self.rng = np.random.default_rng(seed)
        self._members = sample(self.space, self.population, self.rng)
        self._sources: list[str | None] = [None] * self.population
        self._scores: dict[int, float] = {}
        self._generation = 0

    def suggest(self, slots: int) -> TrialGroup | None:
        if self.pending or self._generation >= self.generations:
            return None
        if self._generation > 0:
            self._exploit()
        g = self._generation
        trials = [Trial(f"m{i:03d}@{g}", self.interval, cfg, resume_from=g * self.interval, checkpoint=self._sources[i])
                  for i, cfg in enumerate(self._members)]
        self._sources = [t.trial_id for t in trials]
        self._generation += 1
        self._scores = {}
        return self._group(trials)

    def on_trial_complete(self, trial_id: str, score: float) -> None:
        super().on_trial_complete(trial_id, score)
        self._scores[int(trial_id[1:].split("@")[0])] = float(score)

    def _exploit(self) -> None:
        ranked = sorted(self._scores, key=self._scores.get)
        k = max(1, int(self.quantile * self.population))
        for loser, winner in zip(ranked[-k:], ranked[:k]):
            self._members[loser] = self._explore(self._members[winner])
            self._sources[loser] = self._sources[winner]

    def _explore(self, config: dict[str, Any]) -> dict[str, Any]:
        out = dict(config)
        for name, dom in self.space.items():
            if isinstance(dom, (Uniform, LogUniform)):
                out[name] = float(np.clip(out[name] * self.rng.choice([0.8, 1.2]), dom.low, dom.high))
            elif isinstance(dom, (Grid, Choice)) and self.rng.random() < self.resample_probability:
                out[name] = dom.values[int(self.rng.integers(len(dom.values)))]
        return out

    @property
    def finished(self) -> bool:
        return self._generation >= self.generations and not self.pending
