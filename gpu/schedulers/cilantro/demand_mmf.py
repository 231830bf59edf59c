"""Cilantro-NJC: max-min fairness on learned demands (thesis ch. 3, §3.4, eqs. 3.5–3.6, Fig. 3.6).

Only the demand — where the performance band crosses the SLO at the load UCB — is learned:

* ``d̂``  = smallest allocation whose *LCB* meets the SLO (the conservative demand UCB);
* ``d̄``  = ``argmax_a min(p̂(a) − SLO, SLO − p̌(a))``, the most uncertain point (eq. 3.5);
* ``d^(r) = clip(β d̂ + (1 − β) d̄, d^(r−1) − B, d^(r−1) + B)`` (eq. 3.6, β = 3/4, B = 10);

then the demands are water-filled (:func:`gpu.schedulers.cilantro.fair.max_min_fair`). Round 0
(no demand yet) is the equal split. Fed with the true curves (``learner = "oracle"``) the same
class is Oracle-NJC. The code profile of the authors is ``beta=0.7, clip_demands=False``.

Example: band ``p̂ = min(1, a/40)``, ``p̌ = min(1, max(0, (a−20)/40))``, SLO 0.5 →
``d̂ = 40``, ``d̄ = 30``, ``d = 37.5``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.fair import demand_mmf_units
from gpu.schedulers.cilantro.types import Allocation, JobView, AllocationPolicy, Snapshot, as_allocation


def demand_bounds(job: JobView) -> tuple[float, float]:
    """``(d̂, d̄)`` of one job, in resource amounts, from its performance band on the grid."""
    slo = job.spec.slo
    if slo is None:
        raise ConfigError(f"{job.name}.slo", None, "the NJC policy needs an SLO for every job")
    grid, lcb, ucb = job.alloc_grid, job.perf_lcb, job.perf_ucb
    cap = job.demand_cap if job.demand_cap is not None else float(grid[-1])
    met = np.flatnonzero(lcb >= slo)
    d_hat = min(cap, float(grid[met[0]])) if met.size else cap
    gap = np.minimum(ucb - slo, slo - lcb)
    d_bar = min(cap, float(grid[int(np.argmax(gap))]))
    return d_hat, d_bar


def recommend_demand(d_hat: float, d_bar: float, beta: float, previous: float | None, max_change: float | None) -> float:
    """Eq. (3.6): blend the conservative and exploratory demands, then limit the change to ±B."""
    d = beta * d_hat + (1.0 - beta) * d_bar
    if previous is not None and max_change is not None and np.isfinite(previous):
        d = float(np.clip(d, previous - max_change, previous + max_change))
    return float(d)


class DemandMMF(AllocationPolicy):
    """Cilantro-NJC (``learner="online"``) or Oracle-NJC (``learner="oracle"``).

    Args:
        learner: which bounds the snapshot must carry.
        beta: weight of the conservative demand ``d̂`` in eq. (3.6).
        clip_demands: apply eq. (3.6)'s ±B (the snapshot's ``max_change``) to the demands.
    """

    def __init__(self, name: str = "cilantro-njc", learner: str = "online", beta: float = 0.75, clip_demands: bool = True):
        if not 0.0 <= beta <= 1.0:
            raise ConfigError("beta", beta, "must be in [0, 1]")
        self.name, self.learner, self.beta, self.clip_demands = name, learner, beta, clip_demands
        self._demands: dict[str, float] = {}

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        if snapshot.round_index == 0:
            demands = np.full(snapshot.n, np.inf)
        else:
            b = snapshot.max_change if self.clip_demands else None
            demands = np.array([
                recommend_demand(*demand_bounds(j), self.beta, self._demands.get(j.name), b) for j in snapshot.jobs
            ])
            self._demands = {j.name: float(d) for j, d in zip(snapshot.jobs, demands)}
        return as_allocation(snapshot, demand_mmf_units(snapshot, demands, rng))

    def get_state(self) -> dict[str, Any]:
        return {"demands": dict(self._demands)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._demands = {k: float(v) for k, v in state.get("demands", {}).items()}
