"""Demand-based max-min fairness (the "NJC policy" [39], thesis ch. 3 §3.4) and Resource-Fair.

Water-filling with entitlements ``e_j = w_j / Σw`` (the authors' ``policies/mmf.py`` form): jobs
are visited in increasing ``d_j / e_j``; a job whose demand is below its entitled share of what is
left gets its demand, otherwise the rest is split in proportion to entitlements. Every job ends
with at least ``min(d_j, e_j R)``, so F_NJC = 1, and no job can gain without a poorer one losing.
Resource-Fair is the same procedure with all demands infinite (an equal or weighted split).

Example: ``max_min_fair([5, 20, 40, 80], 100)`` → ``[5, 20, 37.5, 37.5]``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.allocation import finalize
from gpu.schedulers.cilantro.types import Allocation, AllocationPolicy, Snapshot, as_allocation


def max_min_fair(demands: Sequence[float] | np.ndarray, capacity: float,
                 weights: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
    """Weighted water-filling: the demand-based max-min fair split of ``capacity``."""
    d = np.asarray(demands, dtype=float)
    if capacity < 0:
        raise ConfigError("capacity", capacity, "must be >= 0")
    if np.any(d < 0) or np.any(np.isnan(d)):
        raise ConfigError("demands", d.tolist(), "must be >= 0")
    w = np.ones_like(d) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != d.shape or np.any(w <= 0):
        raise ConfigError("weights", w.tolist(), "need one weight > 0 per demand")
    alloc = np.zeros_like(d)
    left, ent_left = float(capacity), float(w.sum())
    order = np.argsort(d / w, kind="stable")
    for pos, j in enumerate(order):
        share = left * w[j] / ent_left
        if d[j] < share:
            alloc[j] = d[j]
            left -= d[j]
            ent_left -= w[j]
            continue
        rest = order[pos:]
        alloc[rest] = left * w[rest] / w[rest].sum()
        break
    return alloc


def demand_mmf_units(snapshot: Snapshot, demands: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Water-fill ``demands`` (resource amounts, job order) and make the result feasible in units.

    When the demands fit in the pool, the leftover stays idle (as in the paper's NJC policy).
    """
    weights = np.array([j.spec.weight for j in snapshot.jobs])
    target = max_min_fair(demands, snapshot.capacity, weights)
    return finalize(snapshot, target, rng, fill=bool(demands.sum() > snapshot.capacity))


class ResourceFair(AllocationPolicy):
    """Equal (or weight-proportional) split of the pool, whatever the jobs need (Table 3.2 baseline)."""

    name = "resource-fair"

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        return as_allocation(snapshot, demand_mmf_units(snapshot, np.full(snapshot.n, np.inf), rng))
