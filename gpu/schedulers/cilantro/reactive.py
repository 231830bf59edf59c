"""Reactive demand heuristics Parties [25] and MIAD [27], adapted to a fixed pool (thesis ch. 3, §3.7).

Both keep a demand per job, adjust it from last round's observed performance and hand the
demands to max-min fairness (the authors' adaptations; their published code never calls the
adjustment, so we implement the stated intent):

* Parties: slack ``(p − SLO)/SLO``; ``< 0.05`` → demand + 20 (upsize when the SLO is at risk),
  ``> 0.2`` → demand − 5 (downsize when there is plenty of headroom);
* MIAD: multiplicative increase ×5 when ``p < SLO``, additive decrease −1 otherwise.

Demands start at the fair share.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from gpu.schedulers.cilantro.fair import demand_mmf_units
from gpu.schedulers.cilantro.types import Allocation, AllocationPolicy, Snapshot, as_allocation


class _ReactiveDemands(AllocationPolicy):
    learner = "none"

    def __init__(self) -> None:
        self._demands: dict[str, float] = {}

    def _adjust(self, demand: float, perf: float, slo: float) -> float:
        raise NotImplementedError

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        fair = snapshot.capacity / snapshot.n
        demands = []
        for j in snapshot.jobs:
            d = self._demands.get(j.name, fair)
            if j.feedback is not None:
                j.spec.utility_of(j.feedback.perf)  # raises ConfigError when the job has no SLO
                d = float(np.clip(self._adjust(d, j.feedback.perf, j.spec.slo), 0.0, snapshot.capacity))
            demands.append(d)
        self._demands = {j.name: d for j, d in zip(snapshot.jobs, demands)}
        return as_allocation(snapshot, demand_mmf_units(snapshot, np.array(demands), rng))

    def get_state(self) -> dict[str, Any]:
        return {"demands": dict(self._demands)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._demands = {k: float(v) for k, v in state.get("demands", {}).items()}


class Parties(_ReactiveDemands):
    """Slack-driven upsizing/downsizing of demands."""

    name = "parties"

    def _adjust(self, demand: float, perf: float, slo: float) -> float:
        slack = (perf - slo) / slo
        if slack < 0.05:
            return demand + 20.0
        return demand - 5.0 if slack > 0.2 else demand


class MIAD(_ReactiveDemands):
    """Multiplicative-increase / additive-decrease of demands."""

    name = "miad"

    def _adjust(self, demand: float, perf: float, slo: float) -> float:
        return max(demand, 1.0) * 5.0 if perf < slo else demand - 1.0
