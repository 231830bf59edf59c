"""Quasar [38] adapted to demand learning (thesis ch. 3, §3.7; authors' ``quasar.py``).

Quasar classifies jobs by collaborative filtering: a sparse matrix of observed performance
(rows = jobs, columns = allocation bins up to R/3, normalised by the SLO) is completed by a
non-negative rank-≤3 factorisation, made monotone along allocations (running max), and each job's
demand is the first bin predicted to meet its SLO; demands are water-filled. Load is ignored,
which is why its demands are inaccurate under a varying load (the paper's finding).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from gpu.schedulers.cilantro.allocation import finalize
from gpu.schedulers.cilantro.fair import demand_mmf_units
from gpu.schedulers.cilantro.types import Allocation, AllocationPolicy, Snapshot, as_allocation


def complete_nonnegative(values: np.ndarray, mask: np.ndarray, rank: int, rng: np.random.Generator,
                         iterations: int = 300, lr: float = 0.05, reg: float = 5e-5) -> np.ndarray:
    """Masked non-negative matrix factorisation by projected gradient; returns the completed matrix."""
    rows, cols = values.shape
    u = rng.uniform(0.1, 1.0, (rows, rank))
    v = rng.uniform(0.1, 1.0, (cols, rank))
    for _ in range(iterations):
        err = mask * (u @ v.T - values)
        u = np.maximum(u - lr * (err @ v + reg * u), 0.0)
        v = np.maximum(v - lr * (err.T @ u + reg * v), 0.0)
    return u @ v.T


class Quasar(AllocationPolicy):
    """Collaborative-filtering demand estimates, then max-min fairness."""

    name = "quasar"
    learner = "none"

    def __init__(self, explore_rounds: int = 2, bin_width: float = 10.0, rank: int = 3):
        self.explore_rounds, self.bin_width, self.rank = explore_rounds, bin_width, rank
        self._sums: dict[str, dict[int, list[float]]] = {}

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        for j in snapshot.jobs:
            if j.feedback is not None:
                cell = self._sums.setdefault(j.name, {}).setdefault(int(j.feedback.alloc // self.bin_width), [0.0, 0.0])
                cell[0] += min(j.feedback.perf / j.spec.slo, 1.5)
                cell[1] += 1
        if snapshot.round_index < self.explore_rounds:
            return as_allocation(snapshot, finalize(snapshot, rng.dirichlet(np.ones(snapshot.n)) * snapshot.capacity, rng))
        cols = max(1, int(snapshot.capacity / 3 // self.bin_width) + 1)
        values, mask = np.zeros((snapshot.n, cols)), np.zeros((snapshot.n, cols))
        for r, j in enumerate(snapshot.jobs):
            for c, (s, k) in self._sums.get(j.name, {}).items():
                if c < cols:
                    values[r, c], mask[r, c] = s / k, 1.0
        done = np.maximum.accumulate(complete_nonnegative(values, mask, self.rank, rng), axis=1)
        demands = np.array([
            (np.flatnonzero(row >= 1.0)[0] + 0.5) * self.bin_width if (row >= 1.0).any() else snapshot.capacity / 3
            for row in done
        ])
        return as_allocation(snapshot, demand_mmf_units(snapshot, demands, rng))

    def get_state(self) -> dict[str, Any]:
        return {"sums": {k: {str(c): v for c, v in d.items()} for k, d in self._sums.items()}}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._sums = {k: {int(c): [float(x) for x in v] for c, v in d.items()} for k, d in state.get("sums", {}).items()}
