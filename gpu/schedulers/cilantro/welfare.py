"""Welfare policies by optimism in the face of uncertainty (thesis ch. 3, §3.4, eq. 3.4).

``a^(r) = argmax_{a ∈ 𝒜^(r)} W(u'_1(p̂_1(a_1, ℓ̂_1)), …, u'_n(p̂_n(a_n, ℓ̂_n)))``: maximise the welfare
of the *UCB* utilities (unexplored allocations look good, so they get tried). With the true curves
(``learner="oracle"``) the same class is the paper's oracular policy.

The paper solves eq. (3.4) with an evolutionary search (and the authors' code uses a maximin local
search for EW); on a unit grid both problems have exact, fast solutions, which we use instead:

* social welfare ``Σ_j w_j u_j`` (and proportional fairness ``Σ_j w_j log u_j``): a knapsack-style
  dynamic programme over units, ``O(n · R · width)`` with ``width`` ≤ 2B+1 once the ±B box is on;
* egalitarian welfare ``min_j u_j``: bisection on the utility level ``t`` — a level is reachable
  iff the fewest units each job needs to reach ``t`` fit in the pool — then leftover units go to
  the worst-off jobs.

Example (Fig. 3.4, R = 60, ``u_j = min(1, a/d_j)``, ``d = (10, 50, 90)``): social → ``(10, 50, 0)``,
egalitarian → ``(4, 20, 36)``.
"""

from __future__ import annotations

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.allocation import box_bounds, fill_leftover
from gpu.schedulers.cilantro.types import Allocation, AllocationPolicy, Snapshot, as_allocation

OBJECTIVES = ("social", "egalitarian", "proportional")


def utility_table(snapshot: Snapshot, *, optimistic: bool = True) -> np.ndarray:
    """Utilities (n × (units+1)) of every job at every whole number of units, from UCBs (or LCBs)."""
    ks = np.arange(snapshot.units + 1) * snapshot.unit
    rows = []
    for j in snapshot.jobs:
        util = j.utility_ucb() if optimistic else j.utility_lcb()
        rows.append(np.maximum.accumulate(np.interp(ks, j.alloc_grid, util)))  # free disposal: more never hurts
    return np.vstack(rows)


def max_sum(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, total: int) -> np.ndarray:
    """Exact ``argmax Σ_j values[j, a_j]`` over integer ``lo ≤ a ≤ hi``, ``Σ a ≤ total`` (dynamic programme)."""
    best = np.full(total + 1, -np.inf)
    best[0] = 0.0
    budgets = np.arange(total + 1)
    choices = []
    for j in range(values.shape[0]):
        ks = np.arange(lo[j], hi[j] + 1)
        src = budgets[:, None] - ks[None, :]
        cand = np.where(src >= 0, best[np.clip(src, 0, None)] + values[j, ks][None, :], -np.inf)
        pick = cand.shape[1] - 1 - np.argmax(cand[:, ::-1], axis=1)  # ties → the larger share
        choices.append(ks[pick])
        best = cand[budgets, pick]
    if not np.isfinite(best).any():
        raise ConfigError("capacity", total, "too small for the per-job minimum allocations")
    b = int(total - np.argmax(best[::-1]))  # ties → use more of the pool
    units = np.zeros(values.shape[0], dtype=int)
    for j in range(values.shape[0] - 1, -1, -1):
        units[j] = choices[j][b]
        b -= units[j]
    return units


def max_min(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, total: int) -> np.ndarray:
    """Exact ``argmax min_j values[j, a_j]`` (values non-decreasing in ``a``) by bisection on the level."""
    n = values.shape[0]
    window = [values[j, lo[j]: hi[j] + 1] for j in range(n)]

    def need(t: float) -> np.ndarray | None:
        req = np.array([lo[j] + np.searchsorted(window[j], t, side="left") for j in range(n)])
        return None if np.any(req > hi) or req.sum() > total else req

    levels = np.unique(np.concatenate(window))
    lo_i, hi_i = 0, len(levels) - 1  # levels[0] is always reachable (every job at its floor)
    while lo_i < hi_i:
        mid = (lo_i + hi_i + 1) // 2
        lo_i, hi_i = (mid, hi_i) if need(levels[mid]) is not None else (lo_i, mid - 1)
    return need(levels[lo_i])


class WelfarePolicy(AllocationPolicy):
    """Cilantro-SW / -EW / -PF (``learner="online"``) or Oracle-SW / -EW (``learner="oracle"``).

    Args:
        objective: ``"social"`` (eq. 3.1), ``"egalitarian"`` (eq. 3.2) or ``"proportional"``
            (``Σ w log u``: proportional fairness of utilities).
        min_units: floor per job (1 mimics the code's evolutionary search, which keeps ≥ 1 unit per job).
    """

    def __init__(self, name: str, objective: str, learner: str = "online", min_units: int = 0):
        if objective not in OBJECTIVES:
            raise ConfigError("objective", objective, f"unknown; choose one of {list(OBJECTIVES)}")
        self.name, self.objective, self.learner, self.min_units = name, objective, learner, min_units

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        lo, hi = box_bounds(snapshot, self.min_units)
        total = snapshot.units
        if snapshot.round_index == 0:  # "our initial allocation is always" the equal split
            return as_allocation(snapshot, fill_leftover(np.full(snapshot.n, total // snapshot.n), hi, total,
                                                         np.arange(snapshot.n)))
        util = utility_table(snapshot)
        weights = np.array([j.spec.weight for j in snapshot.jobs])[:, None]
        if self.objective == "egalitarian":
            units = max_min(util, lo, hi, total)
        elif self.objective == "social":
            units = max_sum(weights * util, lo, hi, total)
        else:
            units = max_sum(weights * np.log(util + 1e-3), lo, hi, total)
        level = util[np.arange(snapshot.n), units]
        return as_allocation(snapshot, fill_leftover(units, hi, total, np.argsort(level, kind="stable")))
