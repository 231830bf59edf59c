"""One GPU worker's batching loop as a ``gpu.contract.Controller``: queue, batch policy, feedback, profiler.

The world (the simulator's ``EventLoop`` in ``gpu.sim.orloj.run``; any driver with a real clock) tells the
controller when a request arrives and when the batch it dispatched finished; each hook returns a frozen
:class:`Dispatch` — the batch to run now, the requests to drop, and which finished requests to time alone for
ORLOJ's profiler (§4.3.2). The controller owns the queue and the policy (ORLOJ or a baseline,
``gpu.batching.POLICIES``), calls the policy's ``observe`` after each batch, and hands the profiler's
published histograms to the policy; it reads no clock. The serving runtime's workers drive their own copies
of the policy through the ``BatchPolicy`` seam on their ring buffers (``tasks/serving/worker.py``); the
serving rollout drives this controller's ``on_epoch`` with the batches they measured, and pushes the
:class:`Reprofiled` histograms it returns to every worker.

Example: idle, ``on_arrival(0.0, r)`` → ``Dispatch(run=(r,))``; busy, ``on_arrival(1.0, r2)`` → ``Dispatch()``;
``on_job_done(40.0, BatchDone(0.0))`` → ``Dispatch(run=(r2,))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from gpu.batching import BatchContext, BatchPolicy, InferenceRequest, observe_batch
from gpu.errors import ConfigError
from gpu.schedulers.orloj.policy import Histogram
from gpu.schedulers.orloj.profiler import OnlineProfiler, longest_alone_ms


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


@dataclass(frozen=True)
class Reprofiled:
    """``on_epoch``'s decision: the histograms every worker's ORLOJ policy adopts now (applications without
    enough measurements keep theirs), and per application the largest batch Algorithm 4.1 can form for a
    request that just arrived — the largest supported size whose ``E[L_B(bs)]`` fits its SLO (lines 10–12);
    0 when none does, so its requests are dropped (line 14).

    Example: ``Reprofiled(histograms=(("chat", <Histogram>),), batch_limits=(("chat", 8),))``.
    """

    histograms: tuple[tuple[str, Histogram], ...] = ()
    batch_limits: tuple[tuple[str, int], ...] = ()

    def limit(self, app: str) -> int:
        return dict(self.batch_limits)[app]


class OrlojController:
    """A worker's batch loop around one batch policy (ORLOJ, Algorithm 4.1, or a baseline).

    Args:
        batch_policy: this worker's own policy instance (for ``on_epoch``: the ORLOJ policy whose histograms the
            workers' copies follow).
        context: ``now → BatchContext`` (the point-estimate ℓ(b), planned and largest batch the policy is told);
            None for a world that only calls ``on_epoch`` (the serving rollout: its workers decide themselves).
        profiler: ORLOJ's online profiler, whose histograms the policy adopts every ``publish_ms``, and at
            every ``on_epoch``.
        slo_ms: each application's SLO, for ``Reprofiled.batch_limits``.
    """

    system = "orloj"
    hooks = ("on_arrival", "on_job_done", "on_wake", "on_epoch")

    def __init__(self, batch_policy: BatchPolicy, context: Callable[[float], BatchContext] | None = None,
                 profiler: OnlineProfiler | None = None, publish_ms: float = math.inf,
                 slo_ms: Mapping[str, float] | None = None):
        self.batch_policy, self.context, self.profiler = batch_policy, context, profiler
        self.slo_ms = dict(slo_ms or {})
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

    def on_epoch(self, now: float, batches: Mapping[str, Sequence[tuple[int, float]]]) -> Reprofiled:
        """An epoch ended: ``batches`` lists, per application, ``(k, ms)`` for every batch of ``k`` of its
        requests a worker ran in it (a worker queues each application apart, so a batch has one). Each becomes
        its longest alone time (``longest_alone_ms``, through the policy's Eq. 4.3 model) in the profiler's
        window; the histograms it publishes replace the policy's (§4.3.2: the scheduler picks the profile up
        periodically), and the decision carries them for the workers' copies."""
        if self.profiler is None or not hasattr(self.batch_policy, "update_histograms"):
            raise ConfigError("batch_policy", self.policy, "on_epoch re-profiles ORLOJ: give an orloj policy and "
                                                           "an OnlineProfiler")
        model = self.batch_policy.model  # type: ignore[attr-defined]
        for app, runs in batches.items():
            for k, ms in runs:
                self.profiler.record(now, app, longest_alone_ms(ms, k, model), batch=k)
        hists = self.profiler.publish(now)
        if hists:
            self.batch_policy.update_histograms(  # type: ignore[attr-defined]
                {**self.batch_policy.histograms, **hists})  # type: ignore[attr-defined]
        return Reprofiled(tuple(sorted(hists.items())), self._batch_limits())

    def _batch_limits(self) -> tuple[tuple[str, int], ...]:
        table = self.batch_policy.table  # type: ignore[attr-defined]
        out = []
        for app, slo in sorted(self.slo_ms.items()):
            fits = [bs for bs in table.batch_sizes if table.means[table.key(app, bs)] <= slo]
            out.append((app, max(fits, default=0)))
        return tuple(out)

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
