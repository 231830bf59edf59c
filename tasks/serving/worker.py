"""A serving worker: one placed Nexus GPU node executing its sessions' batches with a pluggable batch policy.

Nexus §6.3 (node runtime, "batch-aware dispatch"; spec §3.6, the authors' ``backend/gpu_executor.cpp``):
the worker keeps one deadline-ordered queue per session placed on its GPU and visits the sessions
round-robin. At each visit it asks the batch policy (``gpu.batching``: ``EarlyDropPolicy`` for Nexus,
``LazyDropPolicy``, ``FixedBatchPolicy``, or any other ``BatchPolicy`` such as ORLOJ's) what to run and what
to drop, executes the batch on its torch device, and moves on; it never waits for a batch to fill unless
the policy asks it to (``wake_at_ms``). Every request ends as one :class:`~tasks.serving.stats.Outcome`.

Deadlines are ``arrival + SLO`` on ``time.perf_counter`` in ms. The policy is told the planned ℓ(b) from
the model's measured profile, the batch the plan gave the session and the profile's max batch.

The request path is built to cost little per request (the issue's budget: dispatch overhead ≤ 5 % of the
smallest model's batch-1 latency): the frontend's thread appends ``(request, input)`` to a per-session
inbox (one atomic ``deque.append``, no lock) and rings the worker only when it is idle (a raw lock used as
a doorbell, ~0.1 µs, instead of ``Event.set``'s condition variable); the worker moves its inboxes into
queues only it touches (so policies may iterate them freely), runs under ``torch.inference_mode`` for its
whole life, and hands each batch back to the recorder as one chunk, not one object per request.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from gpu.batching import BatchContext, BatchDecision, BatchPolicy, Request
from gpu.errors import ConfigError
from gpu.schedulers.nexus import GpuNode, Placement
from gpu.schedulers.nexus_profiles import PAPER, Accounting, BatchProfile
from tasks.serving.stats import Recorder

_IDLE_POLL_S = 0.05
_RANGES = [tuple(range(n)) for n in range(1025)]  # prefix position tuples, to spot the common decision


def check_policy(policy: Any) -> BatchPolicy:
    """``policy`` if it implements ``BatchPolicy`` (a ``name`` and ``decide(queue, ctx)``), else ConfigError."""
    if not isinstance(policy, BatchPolicy):
        raise ConfigError("batch_policy", policy, "must implement gpu.batching.BatchPolicy (name, decide)")
    return policy


class _Slot:
    """One session on this worker: its inbox (frontend thread), its queue (worker thread) and planned batch."""

    __slots__ = ("placement", "model", "latency", "max_batch", "inbox", "reqs", "inputs", "retiring")

    def __init__(self, placement: Placement, model: nn.Module, profile: BatchProfile, accounting: Accounting):
        self.placement = placement
        self.model = model
        table = [0.0] + [accounting.latency(profile, b) for b in range(1, profile.max_batch + 1)]
        self.latency = table.__getitem__  # ℓ(b) as a C-level lookup: the policy calls it on every decision
        self.max_batch = profile.max_batch
        self.inbox: deque[tuple[Request, torch.Tensor]] = deque()
        self.reqs: deque[Request] = deque()
        self.inputs: deque[torch.Tensor] = deque()
        self.retiring = False

    def pull(self) -> None:
        """Move what the frontend queued into the worker's own queue (worker thread only)."""
        inbox = self.inbox
        n = len(inbox)
        if n == 1:
            r, x = inbox.popleft()
            self.reqs.append(r)
            self.inputs.append(x)
        elif n:
            items = [inbox.popleft() for _ in range(n)]
            self.reqs.extend([r for r, _ in items])
            self.inputs.extend([x for _, x in items])

    def pending(self) -> bool:
        return bool(self.reqs or self.inbox)


def _take(slot: _Slot, dec: BatchDecision) -> tuple[list, list, list]:
    """Remove the decision's positions from the slot's queue; returns (run requests, run inputs, dropped)."""
    run, drop = dec.run, dec.drop
    nr, nd = len(run), len(drop)
    reqs, inputs = slot.reqs, slot.inputs
    if nr + nd <= 1024 and drop == _RANGES[nd] and run == _RANGES[nd + nr][nd:]:
        # drops then runs from the head: what every deadline-ordered policy decides
        dropped = []
        if nd:
            dropped = [reqs.popleft() for _ in drop]
            for _ in drop:
                inputs.popleft()
        if nr == 1:
            return [reqs.popleft()], [inputs.popleft()], dropped
        return [reqs.popleft() for _ in run], [inputs.popleft() for _ in run], dropped
    both = set(run) | set(drop)
    if len(both) != nr + nd or not all(0 <= i < len(reqs) for i in both):
        raise RuntimeError(f"batch policy returned positions outside the queue or twice: {dec}")
    run_r, run_x, dropped = [reqs[i] for i in run], [inputs[i] for i in run], [reqs[i] for i in drop]
    rest = [(r, x) for i, (r, x) in enumerate(zip(reqs, inputs)) if i not in both]
    reqs.clear()
    inputs.clear()
    for r, x in rest:
        reqs.append(r)
        inputs.append(x)
    return run_r, run_x, dropped


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
    """

    def __init__(self, node: GpuNode, models: Mapping[str, nn.Module], profiles: Mapping[str, BatchProfile],
                 policy: BatchPolicy, recorder: Recorder, device: str = "cpu", accounting: Accounting = PAPER):
        self.policy = check_policy(policy)
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
        self.assemble_ns = 0      # stacking inputs (and copying them to the device)
        self.execute_ns = 0       # the model: forward pass, argmax and reading the predictions back
        self.execute1_ns = 0      # ... of the batches of one (the model's batch-1 latency, in the same run)
        self.batches = 0
        self.batches1 = 0
        self.served = 0
        self.update(node)

    # -- configuration ----------------------------------------------------------------------
    def _model(self, name: str) -> nn.Module:
        if name not in self._on_device:
            if name not in self._models_src or name not in self._profiles:
                raise ConfigError("model", name, f"this runtime has no model/profile of that name "
                                                 f"(models: {sorted(self._models_src)})")
            self._on_device[name] = self._models_src[name].to(self.device).eval()
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
                slot = _Slot(p, self._model(p.model), self._profiles[p.model], self.accounting)
            slot.placement, slot.retiring = p, False
            slots.append(slot)
        wanted = {p.session_id for p in node.placements}
        for sid, old in self._by_session.items():
            if sid not in wanted:
                old.retiring = True
                slots.append(old)
        self.node = node
        self._by_session = {s.placement.session_id: s for s in slots}
        self._slots = slots

    @property
    def sessions(self) -> list[str]:
        return [s.placement.session_id for s in self._slots if not s.retiring]

    def queued(self) -> int:
        return sum(len(s.reqs) + len(s.inbox) for s in self._slots)

    # -- request path -------------------------------------------------------------------------
    def enqueue(self, request: Request, x: torch.Tensor) -> None:
        """Queue one request (called by the frontend's thread): one atomic append, a ring only when idle.

        ``x`` is one input: a ``1×d`` row (no copy is needed to run it alone) or a ``d``-vector; all inputs
        of a session have the same shape.
        """
        slot = self._by_session.get(request.app_id)
        if slot is None:  # routed here by a plan this worker no longer runs
            self.recorder.dropped([request], self.node_id)
            return
        slot.inbox.append((request, x))
        if self._idle:
            self._idle = False
            self._ring()

    def enqueue_many(self, requests: Sequence[Request], xs: Sequence[torch.Tensor]) -> None:
        """Queue requests of one session that arrived together: one ``deque.extend``, at most one ring."""
        slot = self._by_session.get(requests[0].app_id) if requests else None
        if slot is None:
            if requests:
                self.recorder.dropped(list(requests), self.node_id)
            return
        slot.inbox.extend(zip(requests, xs))
        if self._idle:
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
            slot.pull()
            self.recorder.dropped(list(slot.reqs), self.node_id)
            slot.reqs.clear()
            slot.inputs.clear()
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
        perf_ns, run_once = time.perf_counter_ns, self.run_once
        while True:
            slots = self._slots
            ran, wake_at = run_once()
            if ran:
                continue
            pending = retire = False
            for s in slots:
                if s.reqs or s.inbox:
                    pending = True
                elif s.retiring:
                    retire = True
            if retire:
                self._retire_empty()
            if self._stop and (not self._drain or not pending):
                return
            self._idle = True  # from here on the frontend rings; re-check the inboxes so no ring is missed
            if self._slots is slots and not self._stop and not any(s.inbox for s in slots):
                t0 = perf_ns()
                self._bell.acquire(timeout=min(_IDLE_POLL_S, max(0.0, (wake_at - t0 / 1e6) / 1000.0)))
                self.wait_ns += perf_ns() - t0
            self._idle = False

    def run_once(self) -> tuple[bool, float]:
        """One round-robin pass: the first session whose policy returns a batch runs it.

        Returns (whether a batch ran, the earliest ``wake_at_ms`` a policy asked for). The worker thread
        calls it in a loop; a worker that was not started can be driven with it from the caller's thread
        (under ``torch.inference_mode()``), e.g. to measure the request path without a second thread.
        """
        slots = self._slots
        n = len(slots)
        wake_at = math.inf
        for k in range(n):
            i = (self._rr + k) % n
            slot = slots[i]
            if slot.inbox:
                slot.pull()
            if not slot.reqs:
                continue
            dec = self.policy.decide(slot.reqs, BatchContext(time.perf_counter_ns() / 1e6, slot.latency,
                                                             slot.placement.batch, slot.max_batch))
            run, xs, dropped = _take(slot, dec)
            if dropped:
                self.recorder.dropped(dropped, self.node_id)
            if run:
                self._execute(slot, run, xs)
                self._rr = (i + 1) % n
                return True, wake_at
            if dec.wake_at_ms is not None:
                wake_at = min(wake_at, dec.wake_at_ms)
        return False, wake_at

    def _retire_empty(self) -> None:
        with self._cfg:
            keep = [s for s in self._slots if not (s.retiring and not s.pending())]
            self._by_session = {s.placement.session_id: s for s in keep}
            self._slots = keep

    def _execute(self, slot: _Slot, run: list[Request], xs: list[torch.Tensor]) -> None:
        t0 = time.perf_counter_ns()
        b = len(xs)
        first = xs[0]
        if first.dim() == 2:  # 1×d rows, as a client sends a batch of one: a lone row needs no assembly
            x = first if b == 1 else torch.cat(xs)
        else:
            x = first.unsqueeze(0) if b == 1 else torch.stack(xs)
        if self._to_device:
            x = x.to(self.device, non_blocking=True)
        t1 = time.perf_counter_ns()
        preds = slot.model(x).argmax(1).tolist()
        t2 = time.perf_counter_ns()
        self.recorder.served(run, preds, self.node_id, t2 / 1e6)
        self.assemble_ns += t1 - t0
        self.execute_ns += t2 - t1
        self.batches += 1
        self.served += b
        if b == 1:
            self.execute1_ns += t2 - t1
            self.batches1 += 1
