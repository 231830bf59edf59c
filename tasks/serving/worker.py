"""A serving worker: one placed Nexus GPU node executing its sessions' batches with a pluggable batch policy.

Nexus §6.3 (node runtime, "batch-aware dispatch"; the authors' ``backend/gpu_executor.cpp``):
the worker keeps one deadline-ordered queue per session placed on its GPU and visits the sessions
round-robin. At each visit it asks the batch policy (a ``gpu.batching.BatchPolicy``: Nexus's ``EarlyDropPolicy``,
``LazyDropPolicy``, ``FixedBatchPolicy``, or any other such as ORLOJ's) what to run and what
to drop, executes the batch on its torch device, and moves on; it never waits for a batch to fill unless
the policy asks it to (``wake_at_ms``). Every request ends as one :class:`~tasks.serving.stats.Outcome`.

Deadlines are ``arrival + SLO`` on ``time.perf_counter_ns``. The policy is told the planned ℓ(b) from
the model's measured profile, the batch the plan gave the session and the profile's max batch.

A policy with only the object API (ORLOJ, its Clockwork-, Nexus- and Clipper-like baselines) decides through the
controller the simulator drives, ``gpu.schedulers.orloj.controller.OrlojController``, one per session on this
worker: the requests that arrived since its last visit go to ``on_arrival`` (each becomes an ``InferenceRequest``
once, when it is handed over), the batch it ran last time to ``on_job_done`` (with the times it ran: the session's
GPU is free again only when the worker comes back to it), otherwise ``on_wake``; the worker applies the returned
``Dispatch`` — drops and the batch, taken out of the ring by request id. One loop in both worlds.

The request path is a structure of arrays (the issue's budget: dispatch overhead ≤ 5 % of the smallest
model's batch-1 latency): the frontend's thread appends a burst to the session's
:class:`~tasks.serving.ring.RequestRing` (array slices, no object per request); a span policy
(``gpu.batching.SpanPolicy``) gets the deadline column and returns ``(n_drop, n_run)``; the batch runs on a
view of the input rows and goes to the recorder as arrays. A policy with only the object API
(``decide(queue, ctx)``) gets ``InferenceRequest`` objects built from the ring (the slow path). The worker thread runs
under ``torch.inference_mode``; its model copies need no gradients, so a forward outside it builds no graph.

Run to completion: when the worker is idle, the pushing (frontend) thread runs the batch itself under the
worker's execution lock (try-acquire, never blocking; if the worker thread holds it, or ``run_inline`` is
off, the doorbell — a raw lock — rings instead) and records it as the worker would: no futex wake-up and
GIL hand-off per request at low load. Requests that come due meanwhile carry their arrival times
(``tasks.serving.loadgen`` passes the scheduled ones), so the wait is in their latency. ``run_inline=False``
suits a GPU model whose forward would block the frontend for milliseconds while other workers wait.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from typing import Any, Callable, Mapping

import torch
from torch import nn

import numpy as np

from gpu.batching import BatchContext, BatchPolicy, InferenceRequest, SpanPolicy
from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement
from gpu.schedulers.nexus.profiles import PAPER, Accounting, BatchProfile
from gpu.schedulers.orloj.controller import BatchDone, Dispatch, OrlojController
from tasks.serving.models import INPUT_FEATURES
from tasks.serving.ring import RequestRing
from tasks.serving.stats import Recorder

_IDLE_POLL_S = 0.05
_now = time.perf_counter_ns


def check_policy(policy: Any) -> BatchPolicy:
    """``policy`` if it implements ``BatchPolicy`` (a ``name`` and ``decide(queue, ctx)``), else ConfigError."""
    if not isinstance(policy, BatchPolicy):
        raise ConfigError("batch_policy", policy, "must implement gpu.batching.BatchPolicy (name, decide)")
    return policy


class _Slot:
    """One session on this worker: its ring of queued requests, the planned batch and ℓ(b) in ns and ms."""

    __slots__ = ("placement", "model", "latency_ns", "latency_ms", "max_batch", "ring", "retiring", "on_done",
                 "controller", "handed", "done")

    def __init__(self, placement: SessionPlacement, model: nn.Module, profile: BatchProfile, accounting: Accounting,
                 width: int | None):
        self.placement = placement
        self.model = model
        ms = [0.0] + [accounting.latency(profile, b) for b in range(1, profile.max_batch + 1)]
        self.latency_ms = ms.__getitem__
        self.latency_ns = [round(v * 1e6) for v in ms].__getitem__  # a C-level lookup: called every decision
        self.max_batch = profile.max_batch
        self.ring = RequestRing(width=width)
        self.retiring = False
        self.on_done: Callable[..., None] | None = None  # a query stage with children: issue them
        self.controller: OrlojController | None = None  # an object policy's batch loop (ServingWorker docstring)
        self.handed = 0  # queued rows (from the head) the controller already holds; the rest are new
        self.done: BatchDone | None = None  # the batch the controller dispatched, not yet reported

    def context(self, now_ms: float) -> BatchContext:
        return BatchContext(now_ms, self.latency_ms, self.placement.batch, self.max_batch)

    def requests(self, apps: tuple[str, ...], start: int | None = None, end: int | None = None) -> list[InferenceRequest]:
        """Rows ``[start, end)`` (default: the queue) as ``InferenceRequest`` objects (ms), for a policy with only the
        object API; ``app_id`` is the application by the ring's ``app`` code (``apps[code - 1]``), or the
        session for code 0 (a request submitted without an application)."""
        r = self.ring
        h = r.head if start is None else start
        t = r.tail if end is None else end
        sid = self.placement.session_id
        names = (sid, *apps)
        return [InferenceRequest(i, names[c], a / 1e6, d / 1e6) for i, c, a, d in
                zip(r.request_id[h:t].tolist(), r.app[h:t].tolist(), r.arrival[h:t].tolist(),
                    r.deadline[h:t].tolist())]


class ServingWorker:
    """Runs one plan node on one torch device in a thread.

    Args:
        node: the plan's GPU node (its placements: session, model, batch).
        models: model name → trained module (moved to ``device`` once per worker).
        profiles: model name → measured batching profile (what the policy assumes ℓ(b) is).
        policy: any ``gpu.batching.BatchPolicy``.
        recorder: where outcomes go.
        device: torch device string of the placement (``"cpu"`` on a simulated pool).
        accounting: latency preset the plan used (``paper`` charges the bare mean ℓ(b)).
        run_inline: when idle, let the pushing thread run the batch (run to completion, no thread wake-up).
        on_done: called as ``on_done(session_id, ids, deadlines, finish_ns, inputs, node_id)`` after each served batch of
            a session in ``parents`` (query stages whose finished requests issue the next stage's,
            ``tasks.serving.chaining``).
        input_width: values per request the models take (a digits image; None: whatever the first request
            has). A request of another width is refused at ``push``, before it can reach the model.
        apps: the application ids by ring code (``Frontend(apps=...)`` assigns code k to ``apps[k - 1]``), so an
            object policy sees each request's application (ORLOJ's per-application histograms).
        measure_batches: keep ``(key, batch size, forward ns)`` of every batch for ``take_batches`` (what the
            rollout's epoch feedback re-profiles ORLOJ and re-solves Nona from); ``"cpu"`` times the forward in
            thread CPU time instead of wall time (on the CPU with one intra-op thread: the work itself, which other
            processes' preemptions do not inflate). The key is the batch's application when its requests have
            one, else its session; a batch mixing applications is left out (its time says nothing of whose
            request was the slowest).
    """

    def __init__(self, node: GpuNode, models: Mapping[str, nn.Module], profiles: Mapping[str, BatchProfile],
                 policy: BatchPolicy, recorder: Recorder, device: str = "cpu", accounting: Accounting = PAPER,
                 run_inline: bool = True, on_done: Callable[..., None] | None = None,
                 parents: frozenset[str] = frozenset(), input_width: int | None = INPUT_FEATURES,
                 apps: tuple[str, ...] = (), measure_batches: bool | str = False):
        if measure_batches not in (False, True, "wall", "cpu"):
            raise ConfigError("measure_batches", measure_batches, "must be False, True/'wall' or 'cpu'")
        self._cpu_clock = measure_batches == "cpu"
        self.policy = check_policy(policy)
        self._span = isinstance(policy, SpanPolicy)
        # a span policy that learns from executed batches; an object policy's controller calls its ``observe``
        self._observe = getattr(policy, "observe", None) if self._span else None
        self.apps = tuple(apps)
        self.device = torch.device(device)
        self.recorder = recorder
        self.accounting = accounting
        self._models_src = models
        self._profiles = profiles
        self._on_device: dict[str, nn.Module] = {}
        self.node_id = node.node_id
        self.node = node
        self._slots: list[_Slot] = []
        self._by_session: dict[str, _Slot] = {}
        self._rr = 0
        self._idle = False
        self._bell = threading.Lock()  # held while nobody rang: the idle worker blocks acquiring it
        self._bell.acquire()
        self._exec = threading.Lock()  # held by whichever thread runs batches: the worker's, or a pusher's
        self.run_inline = run_inline
        self.input_width = input_width
        self._on_done, self._parents = on_done, parents
        self._inline_thread: int | None = None  # the thread running a batch inline (holding ``_exec``)
        self._issued_inline = False  # that batch issued requests to this worker (query stages)
        self._stop = False
        self._drain = True
        self._cfg = threading.Lock()   # update() (flow thread) vs retiring slots (worker thread)
        self._thread: threading.Thread | None = None
        # torch's intra-op (OpenMP) thread count is per OS thread: new threads start at the default, which on
        # a busy CPU made every forward pass ~100x slower than profiled. Carry the creator's setting over.
        self._torch_threads = torch.get_num_threads()
        self._to_device = self.device.type != "cpu"
        self.error: BaseException | None = None
        # wall time (perf_counter ns) of this worker's thread, for the dispatch-overhead accounting
        self._started_ns = 0
        self._ended_ns = 0
        self.wait_ns = 0          # blocked waiting for requests (idle)
        self.execute_ns = 0       # the model: forward pass, argmax and reading the predictions back
        self.execute1_ns = 0      # ... of the batches of one (the model's batch-1 latency, in the same run)
        self.batches = 0
        self.batches1 = 0
        self.inline_batches = 0   # batches a pushing thread ran (run to completion) ...
        self.inline_execute_ns = 0  # ... and their share of execute_ns (the pusher's time, not the worker's)
        self.served = 0
        self._batch_log: list[tuple[str, int, int]] | None = [] if measure_batches else None
        self._taken_codes: np.ndarray | None = None  # the app codes of the rows ``_take`` took last
        self.update(node)

    # -- configuration ----------------------------------------------------------------------
    def _model(self, name: str) -> nn.Module:
        if name not in self._on_device:
            if name not in self._models_src or name not in self._profiles:
                raise ConfigError("model", name, f"this runtime has no model/profile of that name "
                                                 f"(models: {sorted(self._models_src)})")
            src = self._models_src[name]
            model = src.to(self.device)
            if model is src:  # ``to`` is a no-op on the same device: our own copy, not the caller's module
                model = copy.deepcopy(src)
            self._on_device[name] = model.eval().requires_grad_(False)
        return self._on_device[name]

    def update(self, node: GpuNode) -> None:
        """Switch to a new plan for this node: new sessions get queues, removed ones drain then retire."""
        if node.node_id != self.node_id:
            raise ConfigError("node_id", node.node_id, f"worker runs node {self.node_id}")
        with self._cfg:
            self._update(node)
        self._ring()

    def _update(self, node: GpuNode) -> None:
        slots: list[_Slot] = []
        for p in node.placements:
            slot = self._by_session.get(p.session_id)
            if slot is None or slot.placement.model != p.model:
                slot = _Slot(p, self._model(p.model), self._profiles[p.model], self.accounting, self.input_width)
                if not self._span:
                    slot.controller = OrlojController(self.policy, slot.context)
            slot.placement, slot.retiring = p, False
            slot.on_done = self._on_done if p.session_id in self._parents else None
            slots.append(slot)
        wanted = {p.session_id for p in node.placements}
        for sid, old in self._by_session.items():
            if sid not in wanted:
                old.retiring = True
                slots.append(old)
        self.node = node
        self._by_session = {s.placement.session_id: s for s in slots}
        self._slots = slots

    def update_policy(self, change: Callable[[BatchPolicy], None]) -> None:
        """Apply ``change`` to this worker's policy between two batches (holding the execution lock), e.g. ORLOJ's
        re-profiled histograms: no decision ever reads a half-changed policy."""
        with self._exec:
            change(self.policy)

    def take_batches(self) -> list[tuple[str, int, int]]:
        """``(application or session, batch size, forward ns)`` of the batches run since the last call
        (``measure_batches``).
        Lossless while the worker keeps running: only the rows read are cut off."""
        log = self._batch_log
        if log is None:
            return []
        n = len(log)
        out = log[:n]
        del log[:n]
        return out

    @property
    def sessions(self) -> list[str]:
        return [s.placement.session_id for s in self._slots if not s.retiring]

    def queued(self) -> int:
        return sum(len(s.ring) for s in self._slots)

    # -- request path -------------------------------------------------------------------------
    def push(self, session_id: str, ids: np.ndarray | int, arrival_ns: int, deadline_ns: int,
             xs: np.ndarray, app: int = 0) -> None:
        """Queue requests of one session (the frontend's thread): array writes into the session's ring; when the
        worker is idle, run the batch here (run to completion) or, if that is off or the worker thread holds
        the execution lock, ring its doorbell.

        ``ids``: their request ids (an array, or the first of consecutive ids); ``arrival_ns``/``deadline_ns``:
        one stamp for all, or one per request (nondecreasing); ``xs``: their inputs, a float32 ``k×d`` array;
        ``app``: their application's code (0: none; ``apps``).
        Requests that a batch this thread is running inline for this worker issues here (a query stage's next
        stage on the same GPU) are served by that inline run before it returns.
        """
        slot = self._by_session.get(session_id)
        if slot is None:  # routed here by a plan this worker no longer runs
            ids = np.arange(ids, ids + len(xs)) if isinstance(ids, int) else np.asarray(ids)
            self.recorder.dropped(session_id, self.node_id, ids, np.full(len(ids), arrival_ns, np.int64),
                                  np.full(len(ids), deadline_ns, np.int64))
            return
        ring = slot.ring
        ring.push(ids, arrival_ns, deadline_ns, xs, app)
        if self._idle:
            if self._inline_thread == threading.get_ident():
                self._issued_inline = True
            elif self.run_inline and self._exec.acquire(False):
                self._run_inline(ring)
            else:
                self._idle = False
                self._ring()

    def _run_inline(self, ring: RequestRing) -> None:
        """Run one batch on the pushing thread (the worker is idle; the execution lock is held on entry), and
        whatever its batches issued to this worker (query stages), without a thread wake-up.

        The worker thread takes over (doorbell) when the policy ran nothing (it waits to fill a batch: the
        worker keeps the time) or requests are left; a failure stops the worker as if its thread had failed.
        """
        before, batches = self.execute_ns, self.batches
        left = False
        self._inline_thread = threading.get_ident()
        try:
            ran = self.run_once()[0]
            while self._issued_inline:
                self._issued_inline = False
                while self.run_once()[0]:
                    pass
                left = any(s.ring.tail != s.ring.head for s in self._slots)
        except Exception as exc:  # a KeyboardInterrupt is the user's, not the model's: it passes (a clean unwind)
            self.error, self._drain, self._stop = exc, False, True
            ran = False
        finally:
            self._inline_thread = None
            self.inline_execute_ns += self.execute_ns - before
            self.inline_batches += self.batches - batches
            self._exec.release()
        if not ran or left or ring.tail != ring.head:
            self._idle = False
            self._ring()

    def _ring(self) -> None:
        try:
            self._bell.release()
        except RuntimeError:  # already rung
            pass

    @property
    def busy_ns(self) -> int:
        """Wall time the worker thread was not blocked waiting for work (up to now, or to its exit)."""
        if not self._started_ns:
            return 0
        return (self._ended_ns or time.perf_counter_ns()) - self._started_ns - self.wait_ns

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "ServingWorker":
        if self._thread is not None:
            raise RuntimeError(f"worker {self.node_id} already started")
        self._thread = threading.Thread(target=self._loop, name=f"nexus-worker-{self.node_id}", daemon=True)
        self._thread.start()
        return self

    def stop(self, drain: bool = True, timeout: float = 10.0) -> None:
        """Stop after serving (``drain``) or dropping what is queued; the caller releases the lease after."""
        self._drain = drain
        self._stop = True
        self._ring()
        if self._thread is not None:
            self._thread.join(timeout)
        for slot in list(self._slots):  # whatever is still queued was never served
            ring = slot.ring
            with ring.lock:
                if len(ring):
                    self.recorder.dropped(slot.placement.session_id, self.node_id, *ring.rows(ring.head, ring.tail))
                ring.head = ring.tail
        if self.error is not None:
            raise RuntimeError(f"worker {self.node_id} failed: {self.error!r}") from self.error

    # -- the executor loop --------------------------------------------------------------------
    def _loop(self) -> None:
        self._started_ns = time.perf_counter_ns()
        try:
            torch.set_num_threads(self._torch_threads)
            with torch.inference_mode():  # once for the thread's life, not per batch
                self._serve()
        except BaseException as exc:  # surfaced by stop(); the queue is then dropped, never lost silently
            self.error = exc
            self._drain = False
        finally:
            self._ended_ns = time.perf_counter_ns()

    def _serve(self) -> None:
        run_once, lock = self.run_once, self._exec
        while True:
            slots = self._slots
            seen = [s.ring.tail for s in slots]
            if not lock.acquire(False):  # a pusher is running a batch: waiting for it is idle time
                t0 = _now()
                lock.acquire()
                self.wait_ns += _now() - t0
            try:
                ran, wake_at = run_once()
                while ran:
                    ran, wake_at = run_once()
            finally:
                lock.release()
            pending = retire = False
            for s in slots:
                if s.ring.tail != s.ring.head:
                    pending = True
                elif s.retiring:
                    retire = True
            if retire:
                self._retire_empty()
            if self._stop and (not self._drain or not pending):
                return
            # from here on a pusher runs the batch or rings; re-check the rings so no push is missed (rows the
            # policy chose to leave queued were seen: sleep until its wake-up time)
            self._idle = True
            if self._slots is slots and not self._stop and [s.ring.tail for s in slots] == seen:
                t0 = _now()
                self._bell.acquire(timeout=min(_IDLE_POLL_S, max(0.0, (wake_at - t0) / 1e9)))
                self.wait_ns += _now() - t0
            self._idle = False

    def run_once(self) -> tuple[bool, float]:
        """One round-robin pass: the first session whose policy returns a batch runs it.

        Returns (whether a batch ran, the earliest wake-up time in ns a policy asked for). The worker thread
        calls it in a loop (holding the execution lock); a worker that was not started can be driven with it from
        the caller's thread, e.g. to measure the request path without a second thread.
        """
        slots = self._slots
        n = len(slots)
        wake_at = math.inf
        for k in range(n):
            i = (self._rr + k) % n
            slot = slots[i]
            ring = slot.ring
            t, h = ring.tail, ring.head  # tail first: rows below it are written
            if h == t:
                if slot.done is not None:  # its last batch, reported now that nothing waits behind it
                    self._control(slot, _now())
                if h:  # empty: start again at row 0, so a lightly loaded ring keeps reusing a few hot rows
                    ring.compact()
                continue
            if h >= ring.capacity >> 1:
                ring.compact()
                t, h = ring.tail, ring.head
            now = _now()
            if self._span:
                cols = ring.columns
                cols.h, cols.t = h, t
                n_drop, n_run, wake = self.policy.decide_span(  # type: ignore[attr-defined]
                    ring.deadline[h:t], now, slot.latency_ns, slot.placement.batch, slot.max_batch, 0, cols)
                if n_drop < 0 or n_run < 0 or n_drop + n_run > t - h:
                    raise RuntimeError(f"batch policy returned a span outside the queue of {t - h}: "
                                       f"drop {n_drop}, run {n_run}")
            else:
                ran, wake = self._control(slot, now)
                if ran:
                    self._rr = (i + 1) % n
                    return True, wake_at
                if wake is not None:
                    wake_at = min(wake_at, wake)
                continue
            if n_drop:
                self.recorder.dropped(slot.placement.session_id, self.node_id, *ring.rows(h, h + n_drop))
            s = h + n_drop
            ring.head = e = s + n_run
            if n_run:
                try:
                    t1, t2 = self._execute(slot, ring.inputs(s, e), *ring.rows(s, e), codes=ring.app[s:e])
                except BaseException:  # the model failed: its batch is dropped, not lost
                    self.recorder.dropped(slot.placement.session_id, self.node_id, *ring.rows(s, e))
                    raise
                if self._observe is not None:  # rows [s, e) stay in place until the next compaction
                    self._observe(slot.requests(self.apps, s, e), t1 / 1e6, t2 / 1e6)
                self._rr = (i + 1) % n
                return True, wake_at
            if wake is not None:
                wake_at = min(wake_at, wake)
        return False, wake_at

    def _control(self, slot: _Slot, now_ns: int) -> tuple[bool, float | None]:
        """One visit of a session whose policy decides through its ``OrlojController``: hand over the new rows,
        report the last batch (or wake it), apply the ``Dispatch``. Returns (whether a batch ran, wake-up ns)."""
        ctrl, ring, now = slot.controller, slot.ring, now_ns / 1e6
        fresh = ring.tail - ring.head - slot.handed
        decision: Dispatch | None = None
        if fresh:
            arrived = slot.requests(self.apps, ring.head + slot.handed, ring.tail)
            slot.handed += fresh
            decision = ctrl.on_arrival(now, arrived)  # type: ignore[union-attr]
        if slot.done is not None:
            done, slot.done = slot.done, None
            decision = ctrl.on_job_done(now, done)  # type: ignore[union-attr]
        elif decision is None:
            decision = ctrl.on_wake(now)  # type: ignore[union-attr]
        sid = slot.placement.session_id
        if decision.drop:
            _, ids, arr, dl = self._take(slot, decision.drop)
            self.recorder.dropped(sid, self.node_id, ids, arr, dl)
        if not decision.run:
            return False, None if decision.wake_at_ms is None else decision.wake_at_ms * 1e6
        t1, t2 = self._execute(slot, *self._take(slot, decision.run), codes=self._taken_codes)
        slot.done = BatchDone(t1 / 1e6, t2 / 1e6)
        return True, None

    def _take(self, slot: _Slot, requests: tuple[InferenceRequest, ...]) -> tuple[torch.Tensor, np.ndarray, np.ndarray,
                                                                          np.ndarray]:
        """Take ``requests`` (held by the controller) out of the session's ring by id: inputs and columns."""
        ring = slot.ring
        ids = np.fromiter((r.request_id for r in requests), np.int64, len(requests))
        held = ring.request_id[ring.head:ring.head + slot.handed]
        positions = np.flatnonzero(np.isin(held, ids))
        if len(positions) != len(ids):
            raise RuntimeError(f"the controller dispatched {len(ids)} requests, {len(positions)} of them queued")
        slot.handed -= len(ids)
        self._taken_codes = ring.app[ring.head + positions]
        return ring.take(positions)

    def _retire_empty(self) -> None:
        with self._cfg:
            keep = [s for s in self._slots if not (s.retiring and not len(s.ring))]
            self._by_session = {s.placement.session_id: s for s in keep}
            self._slots = keep

    def _execute(self, slot: _Slot, x: torch.Tensor, ids: np.ndarray | int, arrival: np.ndarray | int,
                 deadline: np.ndarray | int, codes: np.ndarray | None = None) -> tuple[int, int]:
        """Run one batch (``x``: its input rows) and hand its ids, timestamps and predictions back as arrays
        (a batch of one's as ints: ``type(ids) is int`` tells it apart without ``len`` of a tensor, ~0.5 µs);
        returns when the forward pass started and ended (ns), for a policy's ``observe``."""
        rows = x
        if self._to_device:
            x = x.to(self.device, non_blocking=True)
        one = type(ids) is int
        c1 = time.thread_time_ns() if self._cpu_clock else 0
        t1 = _now()
        out = slot.model(x).argmax(1)
        preds = out.tolist() if one or self._to_device else out.numpy()  # a 1-list: a third of .numpy()'s cost
        t2 = _now()
        took = time.thread_time_ns() - c1 if self._cpu_clock else t2 - t1
        self.recorder.served(slot.placement.session_id, self.node_id, ids, arrival, deadline, t2, preds)
        if slot.on_done is not None:
            slot.on_done(slot.placement.session_id, ids, deadline, t2, rows, self.node_id)
        self.execute_ns += t2 - t1
        self.batches += 1
        b = 1 if one else len(preds)
        if self._batch_log is not None and codes is not None:
            first = int(codes[0])
            if b == 1 or bool((codes == first).all()):
                self._batch_log.append((self.apps[first - 1] if first else slot.placement.session_id, b, took))
        self.served += b
        if b == 1:
            self.execute1_ns += t2 - t1
            self.batches1 += 1
        return t1, t2
