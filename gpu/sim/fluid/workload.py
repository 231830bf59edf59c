"""Synthetic trials for the FLUID simulator (thesis Eq. 3.2 runtimes): runtimes, overheads and learning curves.

A trial's per-iteration time ``t_1`` is ``iter_time_s`` times a mean-one log-normal factor with coefficient
of variation ``runtime_cv``, drawn from a seed derived from the config (the same config always has the same
speed, F8's "runtime variance"). Packing overhead ``alpha`` and scaling overhead ``beta`` are the same for
every trial of a job (§3.5: trials of one job are similar). The loss after ``t`` total iterations is
``floor + (1 - floor) * exp(-t / tau)`` with ``floor`` growing with the config's squared distance from a
hidden optimum; tuning algorithms only ever see these losses.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.scenario import MAX_FACTOR, MAX_SECONDS, number, positive
from gpu.schedulers.fluid.algorithms import Trial
from gpu.schedulers.fluid.tuning.space import dimensions, encode


@dataclass(frozen=True)
class Workload:
    """How fast and how well synthetic trials train."""

    space: Mapping[str, Any] | None = None
    seed: int = 0
    iter_time_s: float = 1.0
    runtime_cv: float = 0.0
    alpha: float = 1.0
    beta: float = 1.0
    tau: float = 10.0

    def __post_init__(self) -> None:
        """Refuse non-numbers, NaN and inf here: the runtime model divides and exponentiates these values."""
        for name in ("iter_time_s", "tau"):
            positive(getattr(self, name), f"workload.{name}", upper=MAX_SECONDS)
        positive(self.runtime_cv, "workload.runtime_cv", allow_zero=True, upper=10.0)
        if not number(self.alpha, "workload.alpha", upper=MAX_FACTOR) >= 1:
            raise ConfigError("workload.alpha", self.alpha, "packing overhead must be >= 1")
        if not number(self.beta, "workload.beta", upper=MAX_FACTOR) >= 1:
            raise ConfigError("workload.beta", self.beta, "scaling overhead must be >= 1")

    def _rng(self, config: Mapping[str, Any], salt: int) -> np.random.Generator:
        key = zlib.crc32(json.dumps(dict(config), sort_keys=True, default=str).encode())
        return np.random.default_rng([self.seed, salt, key])

    def iter_time(self, config: Mapping[str, Any]) -> float:
        """Seconds per iteration on one GPU for this config (mean ``iter_time_s``)."""
        if self.runtime_cv == 0:
            return self.iter_time_s
        sigma = math.sqrt(math.log1p(self.runtime_cv**2))
        return self.iter_time_s * math.exp(sigma * self._rng(config, 1).standard_normal() - sigma**2 / 2)

    def profile(self, trial: Trial) -> Trial:
        """Attach the measured speed and overheads (what FLUID's profiling would report)."""
        return dataclasses.replace(trial, iter_time_s=self.iter_time(trial.config), alpha=self.alpha, beta=self.beta)

    def loss(self, config: Mapping[str, Any], iterations: float) -> float:
        """Validation loss of ``config`` after ``iterations`` total iterations (lower is better)."""
        floor = 0.3
        if self.space and dimensions(self.space):
            x = encode(self.space, config)
            target = np.random.default_rng([self.seed, 2]).random(x.size)
            floor = 0.05 + 0.5 * float(np.mean((x - target) ** 2))
        return floor + (1 - floor) * math.exp(-iterations / self.tau)

    def score(self, trial: Trial) -> float:
        return self.loss(trial.config, trial.resume_from + trial.budget)
