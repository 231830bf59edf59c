"""Ernest [180] adapted to demand learning (thesis ch. 3, §3.7; authors' ``ernest.py``).

After ``explore_rounds`` random allocations, fit per job a non-negative model of time per query
``t = θ0 + θ1·ℓ/a + θ2·log a + θ3·a`` (``scipy.optimize.nnls``; ``t = 1/(reward·ℓ)`` for latency
jobs, ``1/reward`` for throughput jobs), turn it back into predicted performance, take as demand the
smallest allocation whose prediction meets the SLO (bisection on the unit grid) and water-fill.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from scipy.optimize import nnls

from gpu.schedulers.cilantro.allocation import finalize
from gpu.schedulers.cilantro.fair import demand_mmf_units
from gpu.schedulers.cilantro.types import Allocation, JobView, AllocationPolicy, Snapshot, as_allocation


def _features(alloc: np.ndarray, load: np.ndarray) -> np.ndarray:
    a = np.maximum(alloc, 1e-6)
    return np.column_stack([np.ones_like(a), load / a, np.log(a), a])


class Ernest(AllocationPolicy):
    """Parametric scaling model per job, fitted by non-negative least squares."""

    name = "ernest"
    learner = "none"

    def __init__(self, explore_rounds: int = 10):
        self.explore_rounds = explore_rounds
        self._history: dict[str, list[list[float]]] = {}

    def _demand(self, job: JobView, capacity: float) -> float:
        data = np.array(self._history.get(job.name, []))
        if len(data) < 4:
            return np.inf
        alloc, load, reward = data.T
        thr = bool(np.all(load == 1.0))  # throughput jobs report load ≡ 1
        per_query = 1.0 / np.maximum(reward * (1.0 if thr else load), 1e-6)
        theta, _ = nnls(_features(alloc, load), per_query)
        grid = np.arange(1, int(capacity) + 1, dtype=float)
        pred_t = _features(grid, np.full_like(grid, job.load_ucb)) @ theta
        pred = 1.0 / np.maximum(pred_t * (1.0 if thr else job.load_ucb), 1e-12)
        met = np.flatnonzero(pred >= job.spec.slo)
        return float(grid[met[0]]) if met.size else capacity

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        for j in snapshot.jobs:
            if j.feedback is not None:
                self._history.setdefault(j.name, []).append([j.feedback.alloc, j.feedback.load, j.feedback.perf])
        if snapshot.round_index < self.explore_rounds:
            return as_allocation(snapshot, finalize(snapshot, rng.dirichlet(np.ones(snapshot.n)) * snapshot.capacity, rng))
        demands = np.array([self._demand(j, snapshot.capacity) for j in snapshot.jobs])
        return as_allocation(snapshot, demand_mmf_units(snapshot, demands, rng))

    def get_state(self) -> dict[str, Any]:
        return {"history": {k: [list(r) for r in v] for k, v in self._history.items()}}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._history = {k: [[float(x) for x in r] for r in v] for k, v in state.get("history", {}).items()}
