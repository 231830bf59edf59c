"""A serving worker: one placed Nexus GPU node executing its sessions' batches with a pluggable batch policy.

Nexus §6.3 (node runtime, "batch-aware dispatch"; spec §3.6, the authors' ``backend/gpu_executor.cpp``):
the worker keeps one deadline-ordered queue per session placed on its GPU and visits the sessions
round-robin. At each visit it asks the batch policy (``gpu.batching``: ``EarlyDropPolicy`` for Nexus,
``LazyDropPolicy``, ``FixedBatchPolicy``, or any other ``BatchPolicy`` such as ORLOJ's) what to run and what
to drop, executes the batch on its torch device, and moves on; it never waits for a batch to fill unless
the policy asks it to (``wake_at_ms``). Every request ends as one :class:`~tasks.serving.stats.Outcome`.

Deadlines are ``arrival + SLO`` on ``time.perf_counter`` in ms. The policy is told the planned ℓ(b) from
the model's measured profile, the batch the plan gave the session and the profile's max batch.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Mapping

import torch
from torch import nn

from gpu.batching import BatchContext, BatchDecision, BatchPolicy, Request
from gpu.errors import ConfigError
from gpu.schedulers.nexus import GpuNode, Placement
from gpu.schedulers.nexus_profiles import PAPER, Accounting, BatchProfile
from tasks.serving.stats import Outcome, Recorder

_NAN = math.nan
_IDLE_POLL_S = 0.05


def check_policy(policy: Any) -> BatchPolicy:
    """``policy`` if it implements ``BatchPolicy`` (a ``name`` and ``decide(queue, ctx)``), else ConfigError."""
    if not isinstance(policy, BatchPolicy):
        raise ConfigError("batch_policy", policy, "must implement gpu.batching.BatchPolicy (name, decide)")
    return policy


class _Slot:
    """One session on this worker: its queue (requests and their inputs in the same order) and planned batch."""

    __slots__ = ("placement", "model", "latency", "max_batch", "reqs", "inputs", "lock", "enqueued", "retiring")

    def __init__(self, placement: Placement, model: nn.Module, profile: BatchProfile, accounting: Accounting):
        self.placement = placement
        self.model = model
        table = [0.0] + [accounting.latency(profile, b) for b in range(1, profile.max_batch + 1)]
        self.latency = table.__getitem__  # ℓ(b) as a C-level lookup: the policy calls it on every decision
        self.max_batch = profile.max_batch
        self.reqs: deque[Request] = deque()
        self.inputs: deque[torch.Tensor] = deque()
        self.lock = threading.Lock()
        self.enqueued = 0
        self.retiring = False


def _take(slot: _Slot, dec: BatchDecision) -> tuple[list, list]:
    """Remove the decision's positions from the slot's queue; returns (run, drop) as (request, input) pairs."""
    both = sorted(dec.run + dec.drop)
    if not both:
        return [], []
    reqs, inputs = slot.reqs, slot.inputs
    if both[-1] == len(both) - 1:  # a prefix: the common case for every deadline-ordered policy
        taken = [(reqs.popleft(), inputs.popleft()) for _ in both]
    else:
        keep = set(both)
        taken = {i: (reqs[i], inputs[i]) for i in both}
        rest = [(r, x) for i, (r, x) in enumerate(zip(reqs, inputs)) if i not in keep]
        reqs.clear()
        inputs.clear()
        for r, x in rest:
            reqs.append(r)
            inputs.append(x)
    return [taken[i] for i in dec.run], [taken[i] for i in dec.drop]


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
        self._wake = threading.Event()
        self._stop = False
        self._drain = True
        self._cfg = threading.Lock()   # update() (flow thread) vs retiring slots (worker thread)
        self._thread: threading.Thread | None = None
        # torch's intra-op (OpenMP) thread count is per OS thread: new threads start at the default, which on
        # a busy CPU made every forward pass ~100x slower than profiled. Carry the creator's setting over.
        self._torch_threads = torch.get_num_threads()
        self.error: BaseException | None = None
        # CPU time of this thread (time.thread_time_ns: not inflated by pre-emption on a shared machine)
        self.dispatch_ns = 0      # policy decisions and queue removal
        self.assemble_ns = 0      # stacking inputs and copying them to the device
        self.execute_ns = 0       # forward pass and reading back predictions
        self.batches = 0
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
        self._wake.set()

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
        return sum(len(s.reqs) for s in self._slots)

    # -- request path -------------------------------------------------------------------------
    def enqueue(self, request: Request, x: torch.Tensor) -> None:
        """Queue one request (called by the frontend's thread)."""
        slot = self._by_session.get(request.app_id)
        if slot is None:  # routed here by a plan this worker no longer runs
            self.recorder.add(Outcome(request.request_id, request.app_id, self.node_id, request.arrival_ms,
                                      request.deadline_ms, _NAN, 0, -1))
            return
        with slot.lock:
            slot.reqs.append(request)
            slot.inputs.append(x)
            slot.enqueued += 1
        if self._idle:
            self._wake.set()

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
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for slot in list(self._slots):  # whatever is still queued was never served
            with slot.lock:
                while slot.reqs:
                    r = slot.reqs.popleft()
                    slot.inputs.popleft()
                    self.recorder.add(Outcome(r.request_id, r.app_id, self.node_id, r.arrival_ms, r.deadline_ms,
                                              _NAN, 0, -1))
        if self.error is not None:
            raise RuntimeError(f"worker {self.node_id} failed: {self.error!r}") from self.error

    # -- the executor loop --------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            torch.set_num_threads(self._torch_threads)
            self._serve()
        except BaseException as exc:  # surfaced by stop(); the queue is then dropped, never lost silently
            self.error = exc
            self._drain = False

    def _serve(self) -> None:
        while True:
            slots = self._slots
            seen = sum(s.enqueued for s in slots)
            wake_at = math.inf
            ran = False
            n = len(slots)
            for k in range(n):
                i = (self._rr + k) % n
                slot = slots[i]
                if not slot.reqs:
                    continue
                c0 = time.thread_time_ns()
                with slot.lock:
                    dec = self.policy.decide(slot.reqs, BatchContext(time.perf_counter_ns() / 1e6, slot.latency,
                                                                     slot.placement.batch, slot.max_batch))
                    run, drop = _take(slot, dec)
                self.dispatch_ns += time.thread_time_ns() - c0
                for r, _ in drop:
                    self.recorder.add(Outcome(r.request_id, r.app_id, self.node_id, r.arrival_ms, r.deadline_ms,
                                              _NAN, 0, -1))
                if run:
                    self._execute(slot, run)
                    self._rr = (i + 1) % n
                    ran = True
                    break
                if dec.wake_at_ms is not None:
                    wake_at = min(wake_at, dec.wake_at_ms)
            if ran:
                continue
            if any(s.retiring and not s.reqs for s in slots):
                self._retire_empty()
            if self._stop and (not self._drain or not any(s.reqs for s in slots)):
                return
            self._idle = True
            self._wake.clear()
            if sum(s.enqueued for s in self._slots) == seen and self._slots is slots:
                now_ms = time.perf_counter_ns() / 1e6
                self._wake.wait(min(_IDLE_POLL_S, max(0.0, (wake_at - now_ms) / 1000.0)))
            self._idle = False

    def _retire_empty(self) -> None:
        with self._cfg:
            keep = [s for s in self._slots if not (s.retiring and not s.reqs)]
            self._by_session = {s.placement.session_id: s for s in keep}
            self._slots = keep

    def _execute(self, slot: _Slot, run: list) -> None:
        t0 = time.perf_counter_ns()
        x = torch.stack([x for _, x in run]).to(self.device, non_blocking=True)
        t1 = time.perf_counter_ns()
        with torch.inference_mode():
            preds = slot.model(x).argmax(1).tolist()
        t2 = time.perf_counter_ns()
        finish = t2 / 1e6
        b = len(run)
        add = self.recorder.add
        for (r, _), pred in zip(run, preds):
            add(Outcome(r.request_id, r.app_id, self.node_id, r.arrival_ms, r.deadline_ms, finish, b, pred))
        self.assemble_ns += t1 - t0
        self.execute_ns += t2 - t1
        self.batches += 1
        self.served += b
