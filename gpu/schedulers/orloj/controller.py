"""One GPU worker's batching loop as a ``gpu.contract.Controller``: queue, batch policy, feedback, profiler.

The world (the simulator's ``EventLoop`` in ``gpu.sim.orloj.run``; any driver with a real clock) tells the
controller when a request arrives and when the batch it dispatched finished; each hook returns a frozen
:class:`Dispatch` — the batch to run now, the requests to drop, and which finished requests to time alone for
ORLOJ's profiler (§4.3.2). The controller owns the queue and the policy (ORLOJ or a baseline, any
``gpu.batching.BatchPolicy``) and calls the policy's ``observe`` after each batch; it reads no clock.

Re-profiling has one entry point in both worlds, ``on_epoch``: at every epoch boundary of its clock the world
hands over what it measured in the epoch, per application ``(k, ms)`` of each batch of ``k`` of its requests
(a request timed alone is a batch of one), and adopts the :class:`Reprofiled` histograms it returns. The
simulator passes the requests it timed alone; the serving rollout the batches its workers ran (their own
copies of the policy run through the ``BatchPolicy`` seam, ``tasks/serving/worker.py``) and pushes the
histograms to every worker.

Example: idle, ``on_arrival(0.0, r)`` → ``Dispatch(run=(r,))``; busy, ``on_arrival(1.0, r2)`` → ``Dispatch()``;
``on_job_done(40.0, BatchDone(0.0))`` → ``Dispatch(run=(r2,))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from gpu.batching import BatchContext, BatchPolicy, InferenceRequest, observe_batch
from gpu.errors import ConfigError
from gpu.schedulers.orloj.policy import Histogram, OrlojPolicy
from gpu.schedulers.orloj.profiler import OnlineProfiler, longest_alone_ms
from gpu.schedulers.orloj.queue import OrlojQueue


@dataclass(frozen=True)
class Dispatch:
    """What the worker does now: run ``run`` as one batch, drop ``drop``; time ``profile``'s requests alone
    (report them, as batches of one, at the next ``on_epoch``); with nothing to run, call ``on_wake`` at
    ``wake_at_ms``."""

    run: tuple[InferenceRequest, ...] = ()
    drop: tuple[InferenceRequest, ...] = ()
    profile: tuple[int, ...] = ()
    wake_at_ms: float | None = None


@dataclass(frozen=True)
class BatchDone:
    """The dispatched batch ran from ``started_ms`` to ``finished_ms`` (the policy's ``observe`` needs both; None:
    it finished at the hook's ``now``). A serving worker hosting several sessions reports a session's batch when
    it comes back to that session, so the next decision sees the arrivals of the meantime."""

    started_ms: float
    finished_ms: float | None = None


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
        profiler: ORLOJ's online profiler: it samples which finished requests to time alone (``on_job_done``)
            and publishes, at every ``on_epoch``, the histograms the policy adopts.
        slo_ms: each application's SLO, for ``Reprofiled.batch_limits``.
    """

    system = "orloj"
    hooks = ("on_arrival", "on_job_done", "on_wake", "on_epoch")

    def __init__(self, batch_policy: BatchPolicy, context: Callable[[float], BatchContext] | None = None,
                 profiler: OnlineProfiler | None = None, slo_ms: Mapping[str, float] | None = None):
        self.batch_policy, self.context, self.profiler = batch_policy, context, profiler
        self.slo_ms = dict(slo_ms or {})
        self.policy = batch_policy.name
        # ORLOJ keeps its queue as Algorithm 4.1 does (lines and milestones, §4.4.4); any other policy scans a list
        self._orloj = OrlojQueue(batch_policy) if isinstance(batch_policy, OrlojPolicy) else None
        self._queue: list[InferenceRequest] = []
        self.running: tuple[InferenceRequest, ...] = ()

    @property
    def queue(self) -> list[InferenceRequest]:
        """The pending requests (neither running nor dropped)."""
        return self._orloj.requests if self._orloj is not None else list(self._queue)

    def on_arrival(self, now: float, request: InferenceRequest | Sequence[InferenceRequest]) -> Dispatch:
        """A request, or a burst of them, arrived; dispatch at once when no batch is running."""
        burst = [request] if isinstance(request, InferenceRequest) else list(request)
        if self._orloj is not None:
            self._orloj.add(burst)
        else:
            self._queue.extend(burst)
        return Dispatch() if self.running else self._next(now)

    def on_wake(self, now: float) -> Dispatch:
        return Dispatch() if self.running else self._next(now)

    def on_job_done(self, now: float, done: BatchDone) -> Dispatch:
        """Feed the policy (``observe``), pick the finished requests to time alone, dispatch the next batch."""
        batch, self.running = self.running, ()
        observe_batch(self.batch_policy, batch, done.started_ms, now if done.finished_ms is None else done.finished_ms)
        profile: tuple[int, ...] = ()
        if self.profiler is not None:
            profile = tuple(self.profiler.choose([r.request_id for r in batch]))
        nxt = self._next(now)
        return Dispatch(nxt.run, nxt.drop, profile, nxt.wake_at_ms)

    def on_epoch(self, now: float, batches: Mapping[str, Sequence[tuple[int, float]]]) -> Reprofiled:
        """An epoch ended: ``batches`` lists, per application, ``(k, ms)`` for every batch of ``k`` of its
        requests measured in it (a serving worker queues each application apart, so a batch has one; a request
        timed alone is ``(1, ms)``). Each becomes its longest alone time (``longest_alone_ms``, through the
        policy's Eq. 4.3 model; ``ms`` itself for ``k = 1``) in the profiler's window; the histograms it
        publishes replace the policy's (§4.3.2: the scheduler picks the profile up periodically; an application
        without enough measurements keeps its last), and the decision carries them for the workers' copies."""
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
        """Per application, the largest batch size whose ``E[L_B(bs)]`` (the policy's own Alg. 4.1 line 11
        estimate, ``OrlojPolicy.estimates``) fits its SLO; 0 when none does."""
        policy = self.batch_policy
        sizes = policy.table.batch_sizes  # type: ignore[attr-defined]
        estimate = policy.estimates  # type: ignore[attr-defined]
        return tuple((app, max((bs for bs in sizes if estimate([app], bs)[0] <= slo), default=0))
                     for app, slo in sorted(self.slo_ms.items()))

    def _next(self, now: float) -> Dispatch:
        if self._orloj is not None:
            if not len(self._orloj):
                return Dispatch()
            ctx = self.context(now)
            run, drop = self._orloj.decide(ctx.now_ms, ctx.max_batch, ctx.post_ms)
            self.running = tuple(run)
            return Dispatch(self.running, tuple(drop))
        queue = self._queue
        if not queue:
            return Dispatch()
        dec = self.batch_policy.decide(queue, self.context(now))
        gone = set(dec.run) | set(dec.drop)
        run = tuple(queue[i] for i in dec.run)
        drop = tuple(queue[i] for i in dec.drop)
        if gone:
            self._queue = [r for i, r in enumerate(queue) if i not in gone]
        self.running = run
        return Dispatch(run, drop, (), None if run else dec.wake_at_ms)
