"""Batch policies, the interface: given a model's queue of waiting requests, decide what to run next and what to drop.

A serving worker (simulated in ``gpu.sim.nexus.engine`` and ``gpu.sim.orloj.run``, or real in
``tasks/serving/worker.py``) owns the queue and the clock; it calls ``policy.decide(queue, ctx)`` whenever the GPU
is free for this model and applies the returned :class:`BatchDecision`. Policies hold no runtime handles, so the
same object drives the simulator and a real worker.

This module names no system. The policies themselves belong to the systems that define them and are found by
name through the system registry (``gpu.systems.BATCH_POLICIES``, ``gpu.systems.make_batch_policy``): each
system's entry (``gpu/schedulers/<system>/system.py``) maps its policy names to ``"module:attribute"`` factories,
imported on first use.

A policy that decides over arrays implements :class:`SpanPolicy` (the queue's deadline column → how many to drop
from the head and how many to run next), which the real runtime calls on its ring buffers, and inherits
:class:`SpanAdapter` for the object API ``decide(queue, ctx)`` over an ``InferenceRequest`` queue: one
implementation of each rule. A policy that picks out of order or keeps state implements ``decide`` only and may
learn from executed batches through ``observe`` (:func:`observe_batch`). A policy that prices a batch from its
requests' own execution times does so through a :class:`BatchCostModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Callable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np


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
    then holds its own instance, built by its factory (``gpu.systems.make_batch_policy(name)``), never one shared
    object. A policy that learns from executed batches also defines ``observe(batch, started_ms, finished_ms)``; the
    worker and the simulator call it after every batch (``observe_batch``).
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


class BatchCostModel(Protocol):
    """How long a padded batch runs given its requests' alone (batch-of-one) times, in ms.

    A simulator that draws a per-request execution time for a dynamic model (early exits, decoding loops) asks
    one of these for the batch's time; ORLOJ's ``PaddedBatchModel`` (Eq. 4.3/4.4,
    ``gpu/schedulers/orloj/cost_model.py``) is one.
    """

    def batch_ms(self, alone_ms: Sequence[float] | np.ndarray) -> float: ...


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


class SpanAdapter:
    """The object API (``decide(queue, ctx)``) of a span policy, for a policy class to inherit: one implementation
    of each rule, the array one."""

    def decide(self, queue: Sequence[InferenceRequest], ctx: BatchContext) -> BatchDecision:
        deadlines = np.fromiter(map(_DEADLINE, queue), float, len(queue))
        n_drop, n_run, wake = self.decide_span(deadlines, ctx.now_ms, ctx.latency_ms,  # type: ignore[attr-defined]
                                               ctx.target_batch, ctx.max_batch, ctx.post_ms, _RequestColumns(queue))
        return BatchDecision(tuple(range(n_drop, n_drop + n_run)), tuple(range(n_drop)),
                             None if wake is None else float(wake))
