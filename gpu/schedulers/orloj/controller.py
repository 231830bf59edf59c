"""One GPU worker's batching loop as a ``gpu.contract.Controller``: queue, batch policy, feedback, profiler.

The world (the simulator's ``EventLoop`` in ``gpu.sim.orloj.run``; any driver with a real clock) tells the
controller when a request arrives and when the batch it dispatched finished; each hook returns a frozen
:class:`Dispatch` — the batch to run now, the requests to drop, and which finished requests to time alone for
ORLOJ's profiler (§4.3.2). The controller owns the queue and the policy (ORLOJ or a baseline,
``gpu.batching.POLICIES``), calls the policy's ``observe`` after each batch, and hands the profiler's
published histograms to the policy; it reads no clock. The serving runtime's worker drives the same policy
objects through the ``BatchPolicy`` seam on its ring buffers (``tasks/serving/worker.py``).

Example: idle, ``on_arrival(0.0, r)`` → ``Dispatch(run=(r,))``; busy, ``on_arrival(1.0, r2)`` → ``Dispatch()``;
``on_job_done(40.0, BatchDone(0.0))`` → ``Dispatch(run=(r2,))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from gpu.batching import BatchContext, BatchPolicy, InferenceRequest, observe_batch
from gpu.schedulers.orloj.profiler import OnlineProfiler


@dataclass(frozen=True)
class Dispatch:
    """What the worker does now: run ``run`` as one batch, drop ``drop``; time ``profile``'s requests alone
    (report them in the next ``BatchDone``); with nothing to run, call ``on_wake`` at ``wake_at_ms``."""

    run: tuple[InferenceRequest, ...] = ()
    drop: tuple[InferenceRequest, ...] = ()
    profile: tuple[int, ...] = ()
    wake_at_ms: float | None = None


@dataclass(frozen=True)
class BatchDone:
    """The dispatched batch finished: when it had started, and alone times (ms) the world measured for the
    request ids an earlier ``Dispatch.profile`` asked for."""

    started_ms: float
    alone_ms: Mapping[int, float] = field(default_factory=dict)


class OrlojController:
    """A worker's batch loop around one batch policy (ORLOJ, Algorithm 4.1, or a baseline).

    Args:
        batch_policy: this worker's own policy instance.
        context: ``now → BatchContext`` (the point-estimate ℓ(b), planned and largest batch the policy is told).
        profiler: ORLOJ's online profiler, whose histograms the policy adopts every ``publish_ms``.
    """

    system = "orloj"
    hooks = ("on_arrival", "on_job_done", "on_wake")

    def __init__(self, batch_policy: BatchPolicy, context: Callable[[float], BatchContext],
                 profiler: OnlineProfiler | None = None, publish_ms: float = math.inf):
        self.batch_policy, self.context, self.profiler = batch_policy, context, profiler
        self.policy = batch_policy.name
        self.queue: list[InferenceRequest] = []
        self.running: tuple[InferenceRequest, ...] = ()
        self.publish_ms, self._next_publish = publish_ms, publish_ms
        self._asked: dict[int, InferenceRequest] = {}  # requests sent to be timed alone, by id

    def on_arrival(self, now: float, request: InferenceRequest) -> Dispatch:
        self.queue.append(request)
        return Dispatch() if self.running else self._next(now)

    def on_wake(self, now: float) -> Dispatch:
        return Dispatch() if self.running else self._next(now)

    def on_job_done(self, now: float, done: BatchDone) -> Dispatch:
        """Feed the policy (``observe``) and the profiler, then dispatch the next batch."""
        batch, self.running = self.running, ()
        observe_batch(self.batch_policy, batch, done.started_ms, now)
        profile: tuple[int, ...] = ()
        if self.profiler is not None:
            for rid, ms in done.alone_ms.items():
                self.profiler.record(now, self._asked.pop(rid).app_id, ms)
            chosen = self.profiler.choose([r.request_id for r in batch])
            self._asked.update((r.request_id, r) for r in batch if r.request_id in set(chosen))
            profile = tuple(chosen)
            if now >= self._next_publish:
                self._next_publish = now + self.publish_ms
                hists = self.profiler.publish(now)
                if hists:  # an application without enough samples keeps its last histogram
                    self.batch_policy.update_histograms(  # type: ignore[attr-defined]
                        {**self.batch_policy.histograms, **hists})  # type: ignore[attr-defined]
        nxt = self._next(now)
        return Dispatch(nxt.run, nxt.drop, profile, nxt.wake_at_ms)

    def _next(self, now: float) -> Dispatch:
        if not self.queue:
            return Dispatch()
        dec = self.batch_policy.decide(self.queue, self.context(now))
        gone = set(dec.run) | set(dec.drop)
        run = tuple(self.queue[i] for i in dec.run)
        drop = tuple(self.queue[i] for i in dec.drop)
        self.queue = [r for i, r in enumerate(self.queue) if i not in gone]
        self.running = run
        return Dispatch(run, drop, (), None if run else dec.wake_at_ms)
