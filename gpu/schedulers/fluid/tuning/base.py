"""The contract between a tuning algorithm and FLUID (thesis §3.3.2–3.3.3: a batch of trials handed out together is one TrialGroup).

An algorithm decides *what* to train; FLUID decides *how*. The algorithm hands out work as TrialGroups
through ``suggest(slots)`` and learns through ``on_trial_complete(trial_id, score)`` (scores are losses:
lower is better). Synchronous, stage-based algorithms (grid, random, successive halving, Hyperband,
SyncBOHB, PBT) return their next stage when the previous one is complete and ignore ``slots``;
asynchronous ones (ASHA, BOHB) hand out at most ``slots`` trials as one group (item 12: "batch of trials
handed out together"). ``None`` means "nothing to hand out right now".

Trial ids are ``"<config id>@<rung>"``; a trial that continues a checkpoint carries ``resume_from``
(iterations already trained) and ``checkpoint`` (the trial id whose checkpoint it loads).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import Trial, TrialGroup
from gpu.schedulers.fluid.tuning.space import Space, sample, validate_space


@dataclass(frozen=True)
class Result:
    """One finished trial as the algorithm saw it."""

    trial_id: str
    config: dict[str, Any]
    iterations: float  # total iterations trained by this config (checkpoint + this trial)
    score: float


class ConfigSampler(Protocol):
    """Where new configs come from (random, or BOHB's density model)."""

    def sample(self, n: int) -> list[dict[str, Any]]: ...

    def observe(self, config: dict[str, Any], budget: float, score: float) -> None: ...


class RandomSampler:
    """Configs drawn uniformly from the space (Ray Tune's samplers, seeded)."""

    def __init__(self, space: Space, rng: np.random.Generator):
        self.space = validate_space(space)
        self.rng = rng

    def sample(self, n: int) -> list[dict[str, Any]]:
        return sample(self.space, n, self.rng)

    def observe(self, config: dict[str, Any], budget: float, score: float) -> None:
        """Random search learns nothing."""


class TuningAlgorithm(ABC):
    """Base class: trial bookkeeping shared by every algorithm; subclasses decide what to hand out."""

    name = "algorithm"

    def __init__(self) -> None:
        self.results: list[Result] = []
        self.pending: dict[str, Trial] = {}
        self._groups = 0

    @abstractmethod
    def suggest(self, slots: int) -> TrialGroup | None:
        """The next TrialGroup to run, or None when nothing is ready (idempotent while None)."""

    @property
    @abstractmethod
    def finished(self) -> bool:
        """True once the algorithm will hand out nothing more and every trial reported."""

    def on_trial_complete(self, trial_id: str, score: float) -> None:
        """Record a finished trial's loss; subclasses extend this to promote or exploit."""
        if trial_id not in self.pending:
            raise ConfigError("trial_id", trial_id, f"{self.name}: not a pending trial")
        t = self.pending.pop(trial_id)
        self.results.append(Result(trial_id, dict(t.config), t.resume_from + t.budget, float(score)))

    def best(self) -> Result:
        """The lowest-loss result among trials trained the longest (final-rung results win ties of budget)."""
        if not self.results:
            raise ConfigError("results", [], f"{self.name}: no trial has finished yet")
        top = max(r.iterations for r in self.results)
        return min((r for r in self.results if r.iterations == top), key=lambda r: r.score)

    def _group(self, trials: list[Trial]) -> TrialGroup:
        self._groups += 1
        for t in trials:
            self.pending[t.trial_id] = t
        return TrialGroup(f"{self.name}-{self._groups}", tuple(trials))


def check_budget(value: float, field: str) -> float:
    """Budgets are iterations > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(field, value, "must be > 0 iterations")
    return float(value)


def check_count(value: int, field: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(field, value, f"must be an integer >= {minimum}")
    return int(value)
