"""Nexus on a fixed plan (Shen et al., SOSP'19, §6.1 Fig. 8): the node runs one batch of the plan's size per duty
cycle, dispatched with Nexus's own rule (§6.3 early drop) against the planned ℓ(b).

This is how ORLOJ's evaluation ran Nexus (Yu, thesis §4.2.3: it "pre-computes an execution plan ahead of time
using the average execution time"): the plan does not adapt, so an overrun delays every later batch. ORLOJ's
simulator and benchmark use it by its registry name ``nexus_planned`` (``gpu/schedulers/nexus/system.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from gpu.batching import BatchContext, BatchDecision, BatchPolicy, InferenceRequest
from gpu.errors import ConfigError
from gpu.schedulers.nexus.batching import EarlyDropPolicy

@dataclass
class NexusPlanned:
    """Nexus's node runtime on a fixed plan: at most one batch per duty cycle (§6.1, Fig. 8), each chosen by
    Nexus's dispatch rule with the plan's batch size (``ctx.target_batch``) and the planned ℓ(b).

    Args:
        duty_ms: the plan's duty cycle: a batch starts no sooner than this after the previous one started (a
            batch that overruns it delays the next; the plan does not adapt, §4.2.3 "cannot reach a stable
            state"). None: the planned ℓ(b) of the plan's batch, a saturated node's cycle (what a serving worker,
            told only its placement's batch, can know).
        dispatch: Nexus's dispatch rule (§6.3 early drop by default).

    Example: duty 100 ms; a batch at t = 0 → at t = 40 ``decide`` asks to be woken at 100, and runs then.
    """

    duty_ms: float | None = None
    dispatch: BatchPolicy = field(default_factory=EarlyDropPolicy)
    name: str = "nexus"
    _next_ms: float = field(default=-math.inf, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.duty_ms is not None and not (np.isfinite(self.duty_ms) and self.duty_ms > 0):
            raise ConfigError("duty_ms", self.duty_ms, "need a finite duty cycle > 0 ms (or none: the plan's ℓ(b))")

    def decide(self, queue: Sequence[InferenceRequest], ctx: BatchContext) -> BatchDecision:
        if ctx.now_ms < self._next_ms:
            return BatchDecision(wake_at_ms=self._next_ms)
        decision = self.dispatch.decide(queue, ctx)
        if decision.run:
            duty = ctx.latency_ms(ctx.target_batch) if self.duty_ms is None else self.duty_ms
            self._next_ms = ctx.now_ms + duty
        return decision
