"""Greedy-EW: move one unit from the best-off to the worst-off jobs each round (thesis ch. 3, §3.7 baselines).

"Start equal; each round takes away one CPU each from the top half of the users who had high
utility and allocates it to the bottom half" — using last round's *observed* utilities (authors'
``maximin.py: EgalWelfareGreedy``, at most 9 jobs changed per round, so ``max_pairs = 4``).

Example: from (20, 20, 20) with utilities (1, .4, .22) → (19, 20, 21).
"""

from __future__ import annotations

import numpy as np

from gpu.schedulers.cilantro.allocation import finalize
from gpu.schedulers.cilantro.types import Allocation, AllocationPolicy, Snapshot, as_allocation


class GreedyEW(AllocationPolicy):
    """Feedback-driven maximin hill-climbing, one unit per job pair per round."""

    name = "greedy-ew"
    learner = "none"

    def __init__(self, max_pairs: int = 4):
        self.max_pairs = max_pairs

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        prev = snapshot.previous_units()
        if prev is None or any(j.feedback is None for j in snapshot.jobs):
            return as_allocation(snapshot, finalize(snapshot, np.full(snapshot.n, snapshot.capacity / snapshot.n), rng))
        utils = np.array([float(j.spec.utility_of(j.feedback.perf)) for j in snapshot.jobs])
        order = np.argsort(utils, kind="stable")
        m = min(max(1, snapshot.n // 2), self.max_pairs)
        units = prev.copy()
        givers = [j for j in order[::-1] if units[j] >= 2][:m]
        takers = [j for j in order if j not in givers][: len(givers)]
        units[givers[: len(takers)]] -= 1
        units[takers] += 1
        return as_allocation(snapshot, units)
