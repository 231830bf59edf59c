"""Batch policies: given a model's queue of waiting requests, decide what to run next and what to drop.

A serving worker (simulated in ``gpu.sim.nexus.run`` or real) owns the queue and the clock; it calls
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
* ``orloj`` (``gpu.schedulers.orloj.policy``) — ORLOJ's distribution-aware batching of dynamic DNNs, with its
  Clockwork- and Clipper-like baselines (``gpu.schedulers.orloj.baselines``); these pick out of order or keep
  state, and learn from executed batches through ``observe``.

Every shipped policy decides over arrays (:class:`SpanPolicy`: the queue's deadline column → how many to
drop from the head and how many to run next), which the real runtime calls on its ring buffers; its
object API ``decide(queue, ctx)`` adapts a ``InferenceRequest`` queue onto that one implementation.

Example: with ℓ(b) = b + 10 ms, target 4 and deadlines {5, 12, 30, 45, 60, 95} ms at t = 0,
``EarlyDropPolicy().decide(q, ctx)`` → ``BatchDecision(run=(2, 3, 4, 5), drop=(0, 1))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Callable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from gpu.errors import ConfigError


@dataclass(frozen=True, slots=True)
class InferenceRequest:
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
    """Decides the next batch of one model's queue (earliest deadline first when every app has one SLO).

    A policy may keep state (ORLOJ's histograms, a Clockwork-like plan, Clipper's AIMD batch size): each worker
    then holds its own instance, built by a factory (``POLICIES[name]``), never one shared object. A policy
    that learns from executed batches also defines ``observe(batch, started_ms, finished_ms)``; the worker and
    the simulator call it after every batch (``observe_batch``).
    """

    name: str

    def decide(self, queue: Sequence[InferenceRequest], ctx: BatchContext) -> BatchDecision:
        """Return the batch to run now and the requests to drop. Must not mutate ``queue``; a stateless policy is
        idempotent, a stateful one may change its state only through ``observe``."""
        ...


def observe_batch(policy: BatchPolicy, batch: Sequence[InferenceRequest], started_ms: float, finished_ms: float) -> None:
    """Tell ``policy`` how long a batch it chose really ran, if it listens (its optional ``observe`` hook)."""
    observe = getattr(policy, "observe", None)
    if observe is not None:
        observe(batch, started_ms, finished_ms)


@dataclass(frozen=True)
class PaddedBatchModel:
    """How long a batch of requests with known alone times runs: ORLOJ Eq. 4.3/4.4.

    ``l_B = c0 + c1·k·max_r l_r``: requests are padded to the longest one, so a batch costs its slowest
    request ``k`` times plus a fixed overhead ``c0``. A request's alone time is the batch of one,
    ``a_r = c0 + c1·l_r``, so in alone times ``l_B = c0 + k·max_r (a_r − c0)`` and ``c1`` cancels: only ``c0``
    is a parameter (the thesis leaves it to profiling; ``docs/orloj.md`` says how the simulator picks it).

    ``growth`` replaces the factor ``k`` by a measured one, ``g(k)`` for k = 1, 2, … (``g(1) = 1``), for hardware
    on which a batch's cost grows sublinearly in its size (a GPU, or a tiny model on a CPU): see
    :meth:`from_profile`. Times in ms.
    """

    c0: float = 0.0
    growth: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (np.isfinite(self.c0) and self.c0 >= 0):
            raise ConfigError("c0", self.c0, "need a finite batch overhead >= 0 ms")
        g = np.asarray(self.growth, float)
        if g.size and not (np.all(np.isfinite(g)) and g[0] == 1.0 and np.all(np.diff(g) >= 0)):
            raise ConfigError("growth", self.growth, "need g(1) = 1 and a finite, nondecreasing g(k)")

    @classmethod
    def from_profile(cls, latency_ms: Callable[[int], float], max_batch: int, c0: float) -> "PaddedBatchModel":
        """Fit ``g(k) = (ℓ(k) − c0) / (ℓ(1) − c0)`` from a measured profile ℓ(k) of padded batches."""
        base = latency_ms(1) - c0
        if not base > 0:
            raise ConfigError("c0", c0, f"must be below the batch-of-one latency {latency_ms(1):.4g} ms")
        g = np.maximum.accumulate([max(1.0, (latency_ms(k) - c0) / base) for k in range(1, max_batch + 1)])
        g[0] = 1.0
        return cls(c0, tuple(float(v) for v in g))

    def factor(self, k: int) -> float:
        """How many alone-time works a batch of ``k`` costs: ``k`` (Eq. 4.3) or the measured ``g(k)``."""
        if not self.growth:
            return float(k)
        return self.growth[k - 1] if k <= len(self.growth) else self.growth[-1] * k / len(self.growth)

    def batch_ms(self, alone_ms: Sequence[float] | np.ndarray) -> float:
        """Execution time of one batch whose requests alone take ``alone_ms`` (Eq. 4.3 with Eq. 4.4)."""
        alone = np.asarray(alone_ms, float)
        return self.c0 + self.factor(len(alone)) * max(0.0, float(alone.max()) - self.c0)


Span = tuple[int, int, "float | int | None"]
"""``(n_drop, n_run, wake_at)``: drop the first ``n_drop`` queued requests, run the next ``n_run`` as one
batch; ``wake_at`` (only when ``n_run == 0``) asks to be called again at that time."""


@runtime_checkable
class SpanPolicy(Protocol):
    """A batch policy that decides over arrays, for a runtime that keeps its queues as arrays.

    ``decide_span(deadlines, now, latency, target_batch, max_batch, post, columns) -> Span``:
    ``deadlines`` is the queue's deadline column (earliest first; any numeric dtype — the real runtime passes
    int64 ns, the object API float ms — with ``now``, ``latency(b)`` = ℓ(b) and ``post`` in the same unit);
    ``columns`` maps ``"arrival"``, ``"request_id"``, ``"app"`` to the other per-request columns, aligned with
    ``deadlines``, for policies that decide from per-request metadata (ORLOJ: per-application execution-time
    distributions); Nexus ignores them. The worker takes the span as one slice of its ring: no per-request
    Python work. A policy that must pick positions out of order implements only ``decide``.
    """

    name: str

    def decide_span(self, deadlines: np.ndarray, now: float, latency: Callable[[int], float], target_batch: int,
                    max_batch: int, post: float = 0, columns: Mapping[str, np.ndarray] | None = None) -> Span:
        ...


class _RequestColumns(Mapping):
    """The columns of a ``InferenceRequest`` queue, built only when a policy reads one."""

    _ATTR = {"arrival": "arrival_ms", "request_id": "request_id", "app": "app_id"}

    def __init__(self, queue: Sequence[InferenceRequest]):
        self._queue = queue

    def __getitem__(self, key: str) -> np.ndarray:
        attr = self._ATTR[key]
        return np.array([getattr(r, attr) for r in self._queue])

    def __iter__(self) -> Iterator[str]:
        return iter(self._ATTR)

    def __len__(self) -> int:
        return len(self._ATTR)


_DEADLINE = attrgetter("deadline_ms")


class _SpanAdapter:
    """The object API (``decide(queue, ctx)``) of a span policy: one implementation of each rule."""

    def decide(self, queue: Sequence[InferenceRequest], ctx: BatchContext) -> BatchDecision:
        deadlines = np.fromiter(map(_DEADLINE, queue), float, len(queue))
        n_drop, n_run, wake = self.decide_span(deadlines, ctx.now_ms, ctx.latency_ms,  # type: ignore[attr-defined]
                                               ctx.target_batch, ctx.max_batch, ctx.post_ms, _RequestColumns(queue))
        return BatchDecision(tuple(range(n_drop, n_drop + n_run)), tuple(range(n_drop)),
                             None if wake is None else float(wake))


@dataclass(frozen=True)
class EarlyDropPolicy(_SpanAdapter):
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
class LazyDropPolicy(_SpanAdapter):
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
class FixedBatchPolicy(_SpanAdapter):
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


def _orloj(**params) -> BatchPolicy:
    from gpu.schedulers.orloj.policy import OrlojPolicy

    return OrlojPolicy(**params)


def _clockwork(**params) -> BatchPolicy:
    from gpu.schedulers.orloj.baselines import ClockworkLike

    return ClockworkLike(**params)


def _clipper(**params) -> BatchPolicy:
    from gpu.schedulers.orloj.baselines import ClipperLike

    return ClipperLike(**params)


POLICIES: dict[str, Callable[..., BatchPolicy]] = {
    "early_drop": EarlyDropPolicy,
    "lazy_drop": LazyDropPolicy,
    "fixed_batch": FixedBatchPolicy,
    "orloj": _orloj,  # needs ``histograms=`` (per-application alone times), see gpu.schedulers.orloj.policy
    "clockwork": _clockwork,
    "clipper": _clipper,
}
"""Batch policy factories by name: each call builds a new instance, so every worker owns its policy's state."""


def make_policy(name: str, **params) -> BatchPolicy:
    """A new batch policy by registry name (ConfigError naming ``batch_policy`` when unknown)."""
    if name not in POLICIES:
        raise ConfigError("batch_policy", name, f"unknown; choose one of {sorted(POLICIES)}")
    return POLICIES[name](**params)
