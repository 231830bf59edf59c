"""Batch policies: given a model's queue of waiting requests, decide what to run next and what to drop.

A serving worker (simulated in ``gpu.sim.nexus`` or real) owns the queue and the clock; it calls
``policy.decide(queue, ctx)`` whenever the GPU is free for this model and applies the returned
:class:`BatchDecision`. Policies hold no runtime handles, so the same object drives the simulator and
a real worker.

Implementations:

* :class:`EarlyDropPolicy` — Nexus batch-aware dispatch (Shen et al., SOSP'19, §6.3 "Adaptive batching",
  Fig. 9): a sliding window of the planned batch size scans the deadline-ordered queue, stops at the first
  request that can wait for the whole window's execution, and drops every earlier request.
* :class:`LazyDropPolicy` — Clipper-style baseline (§4.3): drop only requests that cannot finish even in a
  batch of one (the authors' code form; ``literal=True`` drops only requests already past their deadline),
  then size the batch by the earliest request's remaining budget.
* :class:`FixedBatchPolicy` — TF-Serving-style baseline: wait for the planned batch to fill (or until the
  head request must start), never drop.

Example: with ℓ(b) = b + 10 ms, target 4 and deadlines {5, 12, 30, 45, 60, 95} ms at t = 0,
``EarlyDropPolicy().decide(q, ctx)`` → ``BatchDecision(run=(2, 3, 4, 5), drop=(0, 1))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

from gpu.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request waiting in a model's queue (times in ms on the worker's clock).

    ``app_id`` names the application (several apps may share a model session); ``predicted_exec_ms`` is an
    optional per-request execution-time prediction for policies that use one (e.g. ORLOJ); Nexus ignores it.
    """

    request_id: int
    app_id: str
    arrival_ms: float
    deadline_ms: float
    predicted_exec_ms: float | None = None


@dataclass(frozen=True)
class BatchContext:
    """What the worker tells the policy besides the queue.

    Args:
        now_ms: current time.
        latency_ms: ℓ(b), the batch execution time the policy should assume for a batch of b.
        target_batch: the batch size the global plan assigned to this session on this GPU.
        max_batch: the largest batch the model's profile allows.
        post_ms: per-request work after the batch (post-processing) that also counts against the deadline.
    """

    now_ms: float
    latency_ms: Callable[[int], float]
    target_batch: int
    max_batch: int
    post_ms: float = 0.0


@dataclass(frozen=True)
class BatchDecision:
    """Queue positions to execute now as one batch, positions to drop, and when to ask again if idle.

    ``wake_at_ms`` is only meaningful when ``run`` is empty: the worker should call again at that time
    (or at the next arrival, whichever is first).
    """

    run: tuple[int, ...] = ()
    drop: tuple[int, ...] = ()
    wake_at_ms: float | None = None


@runtime_checkable
class BatchPolicy(Protocol):
    """Decides the next batch of one model's queue; the queue is ordered by deadline, earliest first."""

    name: str

    def decide(self, queue: Sequence[Request], ctx: BatchContext) -> BatchDecision:
        """Return the batch to run now and the requests to drop. Must not mutate ``queue``; idempotent."""
        ...


def _window(ctx: BatchContext, n: int) -> int:
    return max(1, min(ctx.target_batch, ctx.max_batch, n))


@dataclass(frozen=True)
class EarlyDropPolicy:
    """Nexus sliding-window early drop (§6.3; authors' code ``backend_batch_policy = 0``)."""

    name: str = "early_drop"

    def decide(self, queue: Sequence[Request], ctx: BatchContext) -> BatchDecision:
        n = len(queue)
        if n == 0:
            return BatchDecision()
        b = _window(ctx, n)
        finish = ctx.now_ms + ctx.latency_ms(b) + ctx.post_ms
        run: list[int] = []
        drop: list[int] = []
        i = 0
        while len(run) < b and i < n:
            if queue[i].deadline_ms < finish:
                drop.append(i)
            else:
                run.append(i)
            i += 1
            if b > len(run) + (n - i):  # fewer requests left than the window: shrink it
                b = max(1, len(run) + (n - i))
                finish = ctx.now_ms + ctx.latency_ms(b) + ctx.post_ms
        return BatchDecision(tuple(run), tuple(drop))


@dataclass(frozen=True)
class LazyDropPolicy:
    """Clipper-style lazy drop: drop only the hopeless, batch by the earliest request's budget (§4.3)."""

    literal: bool = False
    name: str = "lazy_drop"

    def decide(self, queue: Sequence[Request], ctx: BatchContext) -> BatchDecision:
        n = len(queue)
        horizon = ctx.now_ms + (0.0 if self.literal else ctx.latency_ms(1) + ctx.post_ms)
        head = 0
        while head < n and queue[head].deadline_ms < horizon:
            head += 1
        drop = tuple(range(head))
        if head == n:
            return BatchDecision((), drop)
        budget = queue[head].deadline_ms - ctx.now_ms - ctx.post_ms
        b = 1
        for cand in range(_window(ctx, n - head), 1, -1):
            if ctx.latency_ms(cand) < budget:
                b = cand
                break
        return BatchDecision(tuple(range(head, head + b)), drop)


@dataclass(frozen=True)
class FixedBatchPolicy:
    """TF-Serving-style fixed batch: wait until the planned batch is full or the head must start; never drop."""

    wait_for_full: bool = True
    name: str = "fixed_batch"

    def decide(self, queue: Sequence[Request], ctx: BatchContext) -> BatchDecision:
        n = len(queue)
        if n == 0:
            return BatchDecision()
        b = max(1, min(ctx.target_batch, ctx.max_batch))
        if self.wait_for_full and n < b:
            latest_start = queue[0].deadline_ms - ctx.latency_ms(b) - ctx.post_ms
            if ctx.now_ms < latest_start:
                return BatchDecision(wake_at_ms=latest_start)
        return BatchDecision(tuple(range(min(b, n))))


POLICIES: dict[str, Callable[[], BatchPolicy]] = {
    "early_drop": EarlyDropPolicy,
    "lazy_drop": LazyDropPolicy,
    "fixed_batch": FixedBatchPolicy,
}


def make_policy(name: str) -> BatchPolicy:
    """A batch policy by registry name (ConfigError naming ``batch_policy`` when unknown)."""
    if name not in POLICIES:
        raise ConfigError("batch_policy", name, f"unknown; choose one of {sorted(POLICIES)}")
    return POLICIES[name]()
