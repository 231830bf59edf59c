"""The baselines of ORLOJ's evaluation (thesis §4.5) as batch policies that assume data-independent latency.

The thesis ran the original Clockwork, Nexus and Clipper; these re-implement the behaviour it describes
(§4.2.3, §4.5.3) on the same worker and the same profiled point estimate ``ctx.latency_ms(b)`` (mean batch
latency per size, what a data-independent profiler measures):

* :class:`ClockworkLike` — Clockwork (Gujarati et al., OSDI'20) plans each batch to start when the previous one
  is *predicted* to end: earliest deadline first, the largest batch whose predicted finish meets the earliest
  deadline. When a batch overruns its prediction, the already-planned next batch misses its start window and
  fails ("frequent time-out error in its scheduler, causing the subsequent batch to fail", §4.5.3).
* Nexus as the thesis ran it, a fixed plan at a fixed duty cycle, is Nexus's own node runtime:
  ``gpu.schedulers.nexus.planned.NexusPlanned`` (registry name ``nexus_planned``).
* :class:`ClipperLike` — Clipper (Crankshaw et al., NSDI'17, §4.3.1) AIMD: grow the batch by one while the
  observed batch latency stays within the SLO, back off by 10 % when it does not; first come first served,
  no deadline drops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from gpu.batching import BatchContext, BatchDecision, InferenceRequest
from gpu.errors import ConfigError


def _edf(queue: Sequence[InferenceRequest]) -> np.ndarray:
    """Queue positions by deadline (a queue with per-app SLOs is not deadline-ordered)."""
    return np.argsort([r.deadline_ms for r in queue], kind="stable")


@dataclass
class ClockworkLike:
    """Clockwork's predictive planning on a point estimate; an overrun fails the next planned batch.

    Args:
        batch_sizes: the supported batch sizes.
        window_ms: how late after its predicted start a planned batch may still start (Clockwork's action
            window; 0 = only on time).
    """

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    window_ms: float = 0.0
    name: str = "clockwork"
    _predicted_finish: float = field(default=-math.inf, init=False, repr=False)
    _next_fails: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not (np.isfinite(self.window_ms) and self.window_ms >= 0):
            raise ConfigError("window_ms", self.window_ms, "need a finite window >= 0 ms")

    def decide(self, queue: Sequence[InferenceRequest], ctx: BatchContext) -> BatchDecision:
        """EDF; drop what cannot finish even alone; the largest batch predicted to meet its earliest deadline."""
        order = _edf(queue)
        deadlines = np.array([queue[i].deadline_ms for i in order])
        hopeless = int(np.searchsorted(deadlines, ctx.now_ms + ctx.latency_ms(1) + ctx.post_ms, side="left"))
        drop, rest = order[:hopeless].tolist(), order[hopeless:]
        if not rest.size:
            return BatchDecision(drop=tuple(drop))
        fits = [bs for bs in self.batch_sizes if bs <= min(rest.size, ctx.max_batch)
                and ctx.now_ms + ctx.latency_ms(bs) + ctx.post_ms <= deadlines[hopeless]]
        batch = rest[:max(fits, default=1)].tolist()
        if self._next_fails:  # planned while the overrunning batch ran: its start window has passed
            self._next_fails = False
            return BatchDecision(drop=tuple(drop + batch))
        self._predicted_finish = ctx.now_ms + ctx.latency_ms(len(batch))
        return BatchDecision(run=tuple(batch), drop=tuple(drop))

    def observe(self, batch: Sequence[InferenceRequest], started_ms: float, finished_ms: float) -> None:
        self._next_fails = finished_ms > self._predicted_finish + self.window_ms


@dataclass
class ClipperLike:
    """Clipper's additive-increase / multiplicative-decrease batch size (NSDI'17 §4.3.1), FIFO, no drops."""

    increase: int = 1
    backoff: float = 0.9
    name: str = "clipper"
    size: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        if self.increase < 1:
            raise ConfigError("increase", self.increase, "need an additive step >= 1")
        if not 0 < self.backoff < 1:
            raise ConfigError("backoff", self.backoff, "need a multiplicative back-off in (0, 1)")

    def decide(self, queue: Sequence[InferenceRequest], ctx: BatchContext) -> BatchDecision:
        n = min(len(queue), self.size, ctx.max_batch)
        return BatchDecision(run=tuple(range(n)))

    def observe(self, batch: Sequence[InferenceRequest], started_ms: float, finished_ms: float) -> None:
        """Latency objective = the batch's tightest SLO (Clipper's per-application latency objective)."""
        if not batch:
            return
        slo = min(r.deadline_ms - r.arrival_ms for r in batch)
        if finished_ms - started_ms <= slo:
            self.size += self.increase
        else:
            self.size = max(1, math.floor(self.size * self.backoff))


