"""Nexus's dispatch batch policies (Shen et al., SOSP'19, §6.3) and the two baselines of its evaluation (§7.2).

* :class:`EarlyDropPolicy` — Nexus batch-aware dispatch (§6.3 "Adaptive batching", Fig. 9): a sliding window of
  the planned batch size scans the deadline-ordered queue, stops at the first request that can wait for the whole
  window's execution, and drops every earlier request.
* :class:`LazyDropPolicy` — Clipper-style baseline (§4.3): drop only requests that cannot finish even in a
  batch of one (the authors' code form; ``literal=True`` drops only requests already past their deadline),
  then size the batch by the earliest request's remaining budget.
* :class:`FixedBatchPolicy` — TF-Serving-style baseline: wait for the planned batch to fill (or until the
  head request must start), never drop.

Each is a ``gpu.batching.SpanPolicy`` (it decides over the queue's deadline column) with the object API of
``gpu.batching.SpanAdapter``; Nexus's registry entry (``gpu/schedulers/nexus/system.py``) names them
``early_drop``, ``lazy_drop`` and ``fixed_batch`` for ``gpu.systems.make_batch_policy``.

Example: with ℓ(b) = b + 10 ms, target 4 and deadlines {5, 12, 30, 45, 60, 95} ms at t = 0,
``EarlyDropPolicy().decide(q, ctx)`` → ``BatchDecision(run=(2, 3, 4, 5), drop=(0, 1))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from gpu.batching import Span, SpanAdapter


@dataclass(frozen=True)
class EarlyDropPolicy(SpanAdapter):
    """Nexus sliding-window early drop (§6.3; authors' code ``backend_batch_policy = 0``).

    The window of the planned batch b slides from the head; a request is dropped when it cannot wait for
    the window's execution (deadline < now + ℓ(b)); the window shrinks when fewer than b requests are left.
    Over a deadline-ordered queue that is a prefix: ``searchsorted`` finds it while the window is full.
    """

    name: str = "early_drop"

    def decide_span(self, deadlines: np.ndarray, now: float, latency: Callable[[int], float], target_batch: int,
                    max_batch: int, post: float = 0, columns: Mapping[str, np.ndarray] | None = None) -> Span:
        n = len(deadlines)
        if n == 1:  # the common decision at low load: a window of one
            return (0, 1, None) if deadlines[0] >= now + latency(1) + post else (1, 0, None)
        if n == 0:
            return 0, 0, None
        b = max(1, min(target_batch, max_batch, n))
        finish = now + latency(b) + post
        full = n - b + 1  # positions at which the window is still b wide
        k = int(deadlines[:full].searchsorted(finish))  # first one that can wait for the window
        if k < full:
            return k, b, None
        for i in range(full, n):  # the whole full-window part is hopeless: the window shrinks with the queue
            if deadlines[i] >= now + latency(n - i) + post:
                return i, n - i, None
        return n, 0, None


@dataclass(frozen=True)
class LazyDropPolicy(SpanAdapter):
    """Clipper-style lazy drop: drop only the hopeless, batch by the earliest request's budget (§4.3)."""

    literal: bool = False
    name: str = "lazy_drop"

    def decide_span(self, deadlines: np.ndarray, now: float, latency: Callable[[int], float], target_batch: int,
                    max_batch: int, post: float = 0, columns: Mapping[str, np.ndarray] | None = None) -> Span:
        n = len(deadlines)
        horizon = now + (0 if self.literal else latency(1) + post)
        head = int(deadlines.searchsorted(horizon))  # deadline < horizon: cannot finish even alone
        if head == n:
            return n, 0, None
        budget = deadlines[head] - now - post
        for b in range(max(1, min(target_batch, max_batch, n - head)), 1, -1):
            if latency(b) < budget:
                return head, b, None
        return head, 1, None


@dataclass(frozen=True)
class FixedBatchPolicy(SpanAdapter):
    """TF-Serving-style fixed batch: wait until the planned batch is full or the head must start; never drop."""

    wait_for_full: bool = True
    name: str = "fixed_batch"

    def decide_span(self, deadlines: np.ndarray, now: float, latency: Callable[[int], float], target_batch: int,
                    max_batch: int, post: float = 0, columns: Mapping[str, np.ndarray] | None = None) -> Span:
        n = len(deadlines)
        if n == 0:
            return 0, 0, None
        b = max(1, min(target_batch, max_batch))
        if self.wait_for_full and n < b:
            latest_start = deadlines[0] - latency(b) - post
            if now < latest_start:
                return 0, 0, latest_start
        return 0, min(b, n), None
