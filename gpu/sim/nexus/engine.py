"""InferenceRequest-level simulation of a Nexus plan: arrivals, routing, per-GPU round-robin, batch policy, drops.

Built on the shared ``EventLoop`` (the paper has no simulator; docs/nexus.md). Each session's requests
arrive as a Poisson (or uniform, random phase; or the superposition of several uniform streams, e.g. one
per camera feeding a shared session) process, are routed to the session's GPUs by the plan's rate shares
with the serving frontend's load balancer (``nexus_routing.balancer``: deficit round robin by default; a
capped plan's unassigned rate is routed too, by ``route_unassigned``), and wait in a deadline-ordered
queue. Each GPU loops over its sessions round-robin (§6.3, the authors' ``gpu_executor``): for each it
asks the batch policy for a batch, executes it for ℓ(b) from the profile, then moves on — it never waits
for a batch to fill unless the policy asks to. A request is *bad* if it is dropped or finishes after its
deadline (§7 "bad rate").

Routing and chaining are the Nexus controller's decisions (``gpu.schedulers.nexus.controller``, the one the
serving runtime asks). Query stages can be *chained* (``chains``): a child stage's requests are not drawn up
front but issued when a parent request finishes on time, Poisson(γ) of them (γ = average fan-out, §6.2), each
routed by the child's shares. A child's deadline is its parent's deadline plus the child's stage SLO, so the budget a parent did not
use carries over (the authors' slack propagation, their code's ``request_context``); a root-to-leaf path thus
ends by the query's arrival + its end-to-end SLO. A query is bad when any of its requests is
(``SimResult.bad_queries``); a late or dropped parent issues no children (its query is lost already).

CPU pre-processing overlapped with the GPU (OL, §6.3) enters as a per-session *ready delay* ``p``
(``ready_ms``): a request arriving at ``t`` joins its GPU queue at ``t + p`` (the node's CPU pool has
pre-processed it; the pool is assumed to keep up) and keeps its deadline ``t + SLO``, so the plan's session SLO
is the GPU budget ``SLO − p``. Without OL the caller passes profiles with the pre-processing serialised into
the batch time instead (``nexus_profiles.serial_preprocess``); the engine itself has no CPU stage.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple

import numpy as np

from gpu.batching import BatchContext, BatchCostModel, BatchPolicy, InferenceRequest, observe_batch
from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Plan
from gpu.schedulers.nexus.overflow import route_unassigned
from gpu.schedulers.nexus.profiles import Accounting, BatchProfile, fits
from gpu.schedulers.nexus.controller import NexusController
from gpu.schedulers.nexus.routing import DeficitRoundRobin, WeightedRandom
from gpu.sim.events import EventHandle, EventLoop


@dataclass
class SessionStats:
    """Counts for one session over a simulation."""

    offered: int = 0
    good: int = 0
    late: int = 0
    dropped: int = 0
    batches: int = 0
    batched: int = 0

    @property
    def bad_rate(self) -> float:
        return (self.late + self.dropped) / self.offered if self.offered else 0.0


class BatchRecord(NamedTuple):
    """One executed batch (``simulate_plan(..., log_batches=True)``)."""

    session: str
    start_ms: float
    finish_ms: float
    size: int
    node: int  # the plan node (GPU) that ran it


@dataclass
class SimResult:
    """Totals and per-session counts of one run."""

    duration_s: float
    sessions: dict[str, SessionStats] = field(default_factory=dict)
    bad_queries: dict[str, set[int]] = field(default_factory=dict)  # root session -> ids of its bad queries
    batch_log: list[BatchRecord] | None = None  # every batch, when asked for

    def total(self, name: str) -> int:
        return sum(getattr(s, name) for s in self.sessions.values())

    @property
    def bad_rate(self) -> float:
        offered = self.total("offered")
        return (self.total("late") + self.total("dropped")) / offered if offered else 0.0

    @property
    def mean_batch(self) -> float:
        return self.total("batched") / max(1, self.total("batches"))


def arrival_times(rate: float, duration_s: float, process: str, rng: np.random.Generator,
                  streams: int = 1) -> np.ndarray:
    """Arrival times (ms) in [0, duration): ``poisson`` or ``uniform`` (fixed gap, random phase).

    With ``streams`` > 1 a ``uniform`` session is fed by that many independent uniform sources of
    ``rate / streams`` each (own random phase; e.g. 20 cameras sharing one model session, §7.3.2), merged in
    time order; a superposition of Poisson sources is Poisson, so ``streams`` does not change ``poisson``.
    """
    if rate <= 0:
        return np.empty(0)
    horizon = duration_s * 1000.0
    if process == "uniform":
        gap = 1000.0 * streams / rate
        if streams == 1:
            return np.arange(rng.uniform(0, gap), horizon, gap)
        return np.sort(np.concatenate([np.arange(phase, horizon, gap) for phase in rng.uniform(0, gap, streams)]))
    if process == "poisson":
        n = int(rate * duration_s * 1.2 + 10 * np.sqrt(rate * duration_s) + 10)
        t = np.cumsum(rng.exponential(1000.0 / rate, size=n))
        while t[-1] < horizon:
            t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1000.0 / rate, size=n))])
        return t[t < horizon]
    raise ConfigError("arrivals", process, "choose 'poisson' or 'uniform'")


class _Slot:
    """One session on one GPU: its pending arrivals, its queue and the batch context inputs."""

    def __init__(self, sid: str, arrivals: np.ndarray, ids: np.ndarray, slo_ms: float, batch: int,
                 profile: BatchProfile, planned: Accounting, stats: SessionStats):
        self.sid, self.arrivals, self.ids, self.slo_ms, self.batch = sid, arrivals, ids, slo_ms, batch
        self.profile, self.stats = profile, stats
        self.next = 0
        self.queue: deque[InferenceRequest] = deque()
        self.issued: deque[InferenceRequest] = deque()  # chained requests issued by parents, in arrival order
        self.planned_latency = lambda b: planned.latency(profile, b)

    def admit(self, now: float) -> None:
        """Move arrivals up to ``now`` into the deadline-ordered queue (drawn arrivals share one SLO, so their
        arrival order is deadline order; issued ones inherit their parents' slack and are inserted)."""
        end = int(np.searchsorted(self.arrivals, now, side="right"))
        for i in range(self.next, end):
            t = float(self.arrivals[i])
            self.queue.append(InferenceRequest(int(self.ids[i]), self.sid, t, t + self.slo_ms))
        self.next = end
        while self.issued and self.issued[0].arrival_ms <= now:
            r = self.issued.popleft()
            self.queue.insert(bisect_right(self.queue, r.deadline_ms, key=_deadline), r)

    def next_arrival(self) -> float:
        drawn = float(self.arrivals[self.next]) if self.next < len(self.arrivals) else np.inf
        return min(drawn, self.issued[0].arrival_ms) if self.issued else drawn

    def waiting(self) -> list[InferenceRequest]:
        """Everything not yet served: the queue, issued and drawn arrivals still to come."""
        ahead = [InferenceRequest(int(self.ids[i]), self.sid, float(t), float(t) + self.slo_ms)
                 for i, t in enumerate(self.arrivals[self.next:], start=self.next)]
        return [*self.queue, *self.issued, *ahead]


def _deadline(r: InferenceRequest) -> float:
    return r.deadline_ms


def _remove(queue: deque, positions: tuple[int, ...]) -> list[InferenceRequest]:
    """Pop the given queue positions (fast path for a prefix, the common case)."""
    if not positions:
        return []
    if positions == tuple(range(len(positions))):
        return [queue.popleft() for _ in positions]
    keep = set(positions)
    taken = [queue[i] for i in positions]
    rest = [r for i, r in enumerate(queue) if i not in keep]
    queue.clear()
    queue.extend(rest)
    return taken


class AloneTimes(NamedTuple):
    """A dynamic model's per-request cost: alone times drawn per request, a batch priced by Eq. 4.3/4.4."""

    model: BatchCostModel
    sample: Callable[[np.random.Generator, int], np.ndarray]  # (rng, n) -> n alone times, ms


class _Gpu:
    """Round-robin executor of one plan node."""

    def __init__(self, node_id: int, loop: EventLoop, slots: list[_Slot], policy: BatchPolicy, noise: bool,
                 rng: np.random.Generator, chains: _Chains, log: list[BatchRecord] | None,
                 costs: Mapping[str, AloneTimes]):
        self.node_id, self.loop, self.slots, self.policy = node_id, loop, slots, policy
        self.noise, self.rng, self.costs = noise, rng, costs
        self.chains, self.log = chains, log
        self.rr = 0
        self.busy_until = 0.0
        self.pending: EventHandle | None = None

    def schedule(self, t: float) -> None:
        """Wake at ``t`` unless a wake-up at or before ``t`` is already pending (one live wake-up at most)."""
        if self.pending is not None:
            if self.pending.time <= t:
                return
            self.pending.cancel()
        self.pending = self.loop.at(t, self.wake)

    def poke(self) -> None:
        """A chained request just arrived: an idle GPU looks at it now, a busy one when its batch ends."""
        if self.loop.now >= self.busy_until:
            self.schedule(self.loop.now)

    def wake(self) -> None:
        self.pending = None
        now = self.loop.now
        wake_at = np.inf
        for step in range(len(self.slots)):
            i = (self.rr + step) % len(self.slots)
            slot = self.slots[i]
            slot.admit(now)
            if not slot.queue:
                continue
            ctx = BatchContext(now, slot.planned_latency, slot.batch, slot.profile.max_batch)
            dec = self.policy.decide(slot.queue, ctx)
            both = tuple(sorted(dec.run + dec.drop))
            taken = dict(zip(both, _remove(slot.queue, both)))
            slot.stats.dropped += len(dec.drop)
            self.chains.lost(slot.sid, [taken[p] for p in dec.drop])
            if dec.run:
                self._execute(slot, [taken[p] for p in dec.run], now)
                self.rr = (i + 1) % len(self.slots)
                return
            if dec.wake_at_ms is not None:
                wake_at = min(wake_at, dec.wake_at_ms)
        nxt = min([wake_at] + [s.next_arrival() for s in self.slots])
        if np.isfinite(nxt):
            self.schedule(max(nxt, now))

    def _execute(self, slot: _Slot, batch: list[InferenceRequest], now: float) -> None:
        cost = self.costs.get(slot.profile.model)
        if cost is not None:  # a dynamic model: the batch runs as long as its slowest request (Eq. 4.3/4.4)
            dur = cost.model.batch_ms(cost.sample(self.rng, len(batch)))
        else:
            dur = slot.profile.latency(len(batch))
            if self.noise:
                dur = max(0.0, self.rng.normal(dur, slot.profile.std(len(batch))))
        finish = now + dur
        on_time = [r for r in batch if fits(finish, r.deadline_ms)]
        slot.stats.good += len(on_time)
        slot.stats.late += len(batch) - len(on_time)
        self.chains.lost(slot.sid, [r for r in batch if not fits(finish, r.deadline_ms)])
        slot.stats.batches += 1
        slot.stats.batched += len(batch)
        if self.log is not None:
            self.log.append(BatchRecord(slot.sid, now, finish, len(batch), self.node_id))
        self.chains.issue(slot.sid, on_time, finish)
        self.busy_until = finish
        self.loop.at(finish, lambda: observe_batch(self.policy, batch, now, finish), priority=-1)
        self.schedule(finish)


class _Chains:
    """The simulator's side of query chaining: the controller decides which children a finished batch issues
    and their deadlines (``NexusController.chain``); here they become requests on their GPUs' queues, and
    lost requests are booked against their queries (by the root request's id, which children carry)."""

    def __init__(self, loop: EventLoop, result: SimResult, controller: NexusController, ready_ms: Mapping[str, float]):
        self.loop, self.result, self.ctl, self.ready_ms = loop, result, controller, ready_ms
        self.roots = controller.chains.roots
        chains = controller.chains
        self.joined = frozenset(p for j in chains.joins for p in chains.inputs[j])  # parents of a join
        self.routes: dict[str, DeficitRoundRobin | WeightedRandom] = {}  # over (slot, GPU) pairs

    def route(self, sid: str, picker: DeficitRoundRobin | WeightedRandom) -> None:
        """Where a chained session's requests go: ``picker`` over its (slot, GPU) pairs."""
        self.routes[sid] = picker

    def lost(self, sid: str, requests: list[InferenceRequest]) -> None:
        if requests and sid in self.roots:
            self.result.bad_queries.setdefault(self.roots[sid], set()).update(r.request_id for r in requests)

    def issue(self, sid: str, done: list[InferenceRequest], finish: float) -> None:
        if done and sid in self.ctl.chains.parents:
            self.loop.at(finish, lambda: self._arrive(sid, done))

    def _arrive(self, parent: str, done: list[InferenceRequest]) -> None:
        now = self.loop.now
        queries = np.array([r.request_id for r in done]) if parent in self.joined else None
        for issue in self.ctl.chain(now, parent, np.array([r.deadline_ms for r in done]), queries):
            child = issue.session_id
            ready = self.ready_ms.get(child, 0.0)  # pre-processed by the CPU pool first (OL)
            reqs = [InferenceRequest(done[p].request_id, child, now + ready, float(d))
                    for p, d in zip(issue.parents.tolist(), issue.deadlines.tolist())]
            stats = self.result.sessions.setdefault(child, SessionStats())
            stats.offered += len(reqs)
            if child not in self.routes:  # nothing hosts it
                stats.dropped += len(reqs)
                self.lost(child, reqs)
                continue
            pick = self.routes[child]
            for r, j in zip(reqs, pick.pick_many(len(reqs))):
                slot, gpu = pick.targets[j]
                slot.issued.append(r)
                gpu.poke()


def simulate_plan(plan: Plan, profiles: Mapping[str, BatchProfile], policy: BatchPolicy | None, *,
                  rates: Mapping[str, float] | None = None, duration_s: float = 20.0, arrivals: str = "poisson",
                  noise: bool = False, seed: int = 0, planned: Accounting | None = None,
                  streams: Mapping[str, int] | None = None,
                  chains: Mapping[str, tuple[str, float]] | None = None,
                  ready_ms: Mapping[str, float] | None = None, log_batches: bool = False,
                  load_balancer: str = "drr", controller: NexusController | None = None,
                  policy_factory: Callable[[], BatchPolicy] | None = None,
                  alone_times: Mapping[str, AloneTimes] | None = None) -> SimResult:
    """Run ``plan`` against offered ``rates`` (default: the plan's session rates) and count bad requests.

    All traffic is routed, as by the real frontend: a capped plan's ``unassigned`` rate goes onto GPUs by
    ``route_unassigned`` and the batch policy decides what of it is served, dropped or late.

    Args:
        planned: the latency accounting the policy assumes (default: the plan's own preset).
        streams: independent uniform sources per session id (default 1; see ``arrival_times``).
        chains: ``{child session: (parent session, γ)}`` — the child's requests are issued by its parent's
            finished requests instead of drawn at its offered rate (module docstring).
        ready_ms: per session id, the CPU pre-processing (ms) overlapped with the GPU before a request can join
            a batch (OL); the session's plan SLO is its GPU budget, the request's deadline stays arrival + the
            SLO it was planned from (module docstring).
        log_batches: record every batch in ``SimResult.batch_log``.
        load_balancer: how a session's requests are spread over its GPUs, by the serving frontend's
            ``gpu.schedulers.nexus.routing.balancer`` (``drr``, the authors' default, or ``weighted_random``).
        controller: the Nexus controller that routes and chains (default: one for this fixed plan with
            ``chains`` and ``load_balancer``, drawing from the run's seeded generator); it is given the plan
            with its unassigned load routed (``NexusController.install``). Its own stages and load balancer
            apply, so ``chains`` must then be left out.
        policy_factory: instead of sharing ``policy``, build one per GPU (a policy with state, e.g. ORLOJ's
            baselines, learns from its own GPU's batches through ``observe``).
        alone_times: per model name, a dynamic model's per-request alone times and batch model: its batches
            run for Eq. 4.3/4.4 on the sampled times instead of the profile's ℓ(b) (ORLOJ, ``docs/orloj.md``).
    """
    from gpu.schedulers.nexus.profiles import PRESETS

    if (policy is None) == (policy_factory is None):
        raise ConfigError("batch_policy", policy, "give either one policy or a policy_factory")
    rng = np.random.default_rng(seed)
    acc = planned or PRESETS[plan.preset]
    offered = dict(rates) if rates is not None else {s.session_id: s.rate for s in plan.sessions}
    plan = route_unassigned(plan, profiles, acc)
    by_id = {s.session_id: s for s in plan.sessions}
    if controller is not None and chains:
        raise ConfigError("chains", dict(chains), "a run with a controller chains by the controller's stages")
    ctl = controller or NexusController(chains=chains, load_balancer=load_balancer, rng=rng)
    chains = ctl.chains.chains
    ready = dict(ready_ms or {})
    for sid, delay in ready.items():
        if sid not in by_id or not (np.isfinite(delay) and delay >= 0):
            raise ConfigError(f"ready_ms.{sid}", delay, "need a session of the plan and a finite delay >= 0")
    for child, parents in ctl.chains.inputs.items():
        if child not in by_id or any(p not in by_id for p in parents):
            raise ConfigError("chains", child, "child and parent must both be sessions of the plan")
    ctl.install(plan, ready)
    result = SimResult(duration_s, batch_log=[] if log_batches else None)
    routed: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    for sid, rate in offered.items():
        if sid not in by_id:
            raise ConfigError("rates", sid, "not a session of the plan")
        stats = result.sessions.setdefault(sid, SessionStats())
        if sid in chains:
            continue  # issued by its parent's requests
        t = arrival_times(rate, duration_s, arrivals, rng, (streams or {}).get(sid, 1)) + ready.get(sid, 0.0)
        stats.offered = len(t)
        picker = ctl.route(sid, {n: n for n in ctl.router.nodes(sid)[0]})
        if picker is None:
            stats.dropped += len(t)  # nothing hosts it: every request is dropped
            continue
        pick = picker.pick_many(len(t))
        ids = np.arange(len(t))
        for j, nid in enumerate(picker.targets):
            routed[(sid, nid)] = t[pick == j], ids[pick == j]
    loop = EventLoop()
    chained = _Chains(loop, result, ctl, ready)
    gpus = []
    hosts: dict[str, dict[int, tuple[_Slot, _Gpu]]] = {}
    for node in plan.nodes:
        slots = [_Slot(p.session_id, *routed.get((p.session_id, node.node_id), (np.empty(0), np.empty(0, int))),
                       p.slo_ms, p.batch, profiles[p.model], acc,
                       result.sessions.setdefault(p.session_id, SessionStats()))
                 for p in node.placements]
        gpu = _Gpu(node.node_id, loop, slots, policy_factory() if policy_factory else policy, noise, rng, chained,
                   result.batch_log, alone_times or {})
        gpus.append(gpu)
        gpu.schedule(0.0)
        for slot in slots:
            hosts.setdefault(slot.sid, {})[node.node_id] = (slot, gpu)
    for sid in chains:
        picker = ctl.route(sid, hosts.get(sid, {}))
        if picker is not None:
            chained.route(sid, picker)
    depth = max((ctl.chains.depth(sid) for sid in chains), default=0)
    horizon = duration_s * 1000.0 + 20 * (1 + depth) * max((s.slo_ms + ready.get(s.session_id, 0.0)
                                                             for s in plan.sessions), default=0.0)
    loop.run(until=horizon)
    for gpu in gpus:  # anything still waiting after the drain horizon never got served
        for slot in gpu.slots:
            left = slot.waiting()
            slot.stats.dropped += len(left)
            chained.lost(slot.sid, left)
    return result

