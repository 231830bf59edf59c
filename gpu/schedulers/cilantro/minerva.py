"""Minerva adaptation: allocation ∝ (previous allocation) / (forecast utility) (thesis ch. 3, §3.7, [124]).

Minerva targets egalitarian QoS: a job doing poorly gets a larger weight. The authors' adaptation
(``minerva.py``) forecasts each job's reward with ARIMA, ``û_j = min(r̂_j, SLO)/SLO``, sets weights
``(a_j + 1e-4)/(û_j + 1e-4)`` and splits the pool in proportion, with a floor of 0.00101·R per job.

Example: from (20, 20, 20) with utilities (1, .4, .2222) → shares (0.12566, 0.31259, 0.56175).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from gpu.schedulers.cilantro.allocation import finalize
from gpu.schedulers.cilantro.forecasters import ArimaForecaster
from gpu.schedulers.cilantro.types import Allocation, AllocationPolicy, Snapshot, as_allocation

FLOOR = 0.00101


def minerva_shares(prev: np.ndarray, utilities: np.ndarray) -> np.ndarray:
    """Fractions of the pool: weights ``(a+1e-4)/(u+1e-4)`` normalised, above a per-job floor."""
    w = (prev + 1e-4) / (utilities + 1e-4)
    return FLOOR + (1 - len(prev) * FLOOR) * w / w.sum()


class Minerva(AllocationPolicy):
    """Reward-forecast–driven proportional reallocation (no performance model)."""

    name = "minerva"
    learner = "none"

    def __init__(self) -> None:
        self._rewards: dict[str, ArimaForecaster] = {}

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        prev = snapshot.previous_units()
        if prev is None or any(j.feedback is None for j in snapshot.jobs):
            return as_allocation(snapshot, finalize(snapshot, np.full(snapshot.n, snapshot.capacity / snapshot.n), rng))
        utils = []
        for j in snapshot.jobs:
            fc = self._rewards.setdefault(j.name, ArimaForecaster(window=200))
            fc.update(j.feedback.perf)
            utils.append(float(j.spec.utility_of(max(fc.forecast()[0], 0.0)) ** (1 / j.spec.exponent)))
        shares = minerva_shares(prev * snapshot.unit, np.array(utils))
        return as_allocation(snapshot, finalize(snapshot, shares * snapshot.capacity, rng))

    def get_state(self) -> dict[str, Any]:
        return {"rewards": {k: f.get_state() for k, f in self._rewards.items()}}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._rewards = {}
        for k, s in state.get("rewards", {}).items():
            self._rewards[k] = ArimaForecaster()
            self._rewards[k].set_state(s)
