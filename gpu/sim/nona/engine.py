"""The network-aware cluster Nona is evaluated in (§IV-A): servers and one bottleneck link, on ``EventLoop``.

The paper "augment[s] the event-based simulator in Decima to become network-aware"; this is that world, small:

* N identical servers, each running one task at a time, non-preemptively (§III-B); a task joins its
  server's queue once all its inputs have arrived, and a server serves the oldest job's task first (FIFO
  over jobs: a query's forward pass continues as soon as it can, as one model does on one server, instead
  of re-queueing behind younger queries at every layer);
* one bottleneck link, a FIFO queue serving a transfer of b bytes in b/μ (§III-B); an edge whose two tasks
  share a server costs nothing;
* Poisson arrivals per class, plus the cluster's background jobs (§IV-A): single-task compute jobs with no
  transfer and single-transfer communication jobs with no compute, at ``Cluster.bg_compute_rate`` and
  ``bg_comm_rate`` (the paper's inference:background ratio is 100:1);
* placement: a ``Placer`` (a sampler reading no live state: Nona, Nona*, Expert, Opportunistic, Random,
  undistributed) fixes every task's server at arrival; ``placer=None`` runs Spark's fair scheduler instead,
  which reads live state: one pool of ready tasks (all parents computed), started on a uniformly random free
  server, the job with the fewest running tasks first and the oldest among equals, each task releasing its
  server when done (the paper's modification); a placed task fetches its remote inputs holding its server.

Rates may change in ``phases`` (every stream scaled from a phase's start). A ``gpu.contract.Controller``
(``NonaController``) may stand in for the placer: the world calls its ``on_arrival(now, query)``, and every
``epoch_s`` hands the rates it measured over the epoch to ``on_epoch(now, rates)`` (§III-A's lookup table).

Arrivals stop at ``horizon_s`` and the run drains, so every job that arrived after ``warmup_s`` finishes: an
unstable scheme (ρ ≥ 1) shows as JCTs that grow with the horizon, which the report logs.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import numpy as np

from gpu.contract import Controller
from gpu.schedulers.nona.optimizer import Cluster
from gpu.schedulers.nona.dag import Dag
from gpu.schedulers.nona.controller import QueryPlacement, Query
from gpu.sim.events import EventLoop

BACKGROUND_COMPUTE, BACKGROUND_COMM = "background-compute", "background-comm"
LIVE = ("spark", "sjf_cp")
"""The schedulers that read live state: Spark's fair scheduler and the Decima-style SJF-CP list scheduler."""


class Placer(Protocol):
    """A policy that places a whole query at its arrival (a ``gpu.contract.DecisionPolicy``)."""

    name: str

    def decide(self, query: Query) -> QueryPlacement: ...


@dataclass(frozen=True)
class Workload:
    """What arrives: per-class (contracted DAG, rate per second), horizon and warm-up (seconds), seed, and
    ``phases``: (start_s, scale) pairs multiplying every rate from that time on (scale 1 before the first)."""

    classes: Mapping[str, tuple[Dag, float]]
    horizon_s: float = 60.0
    warmup_s: float = 10.0
    seed: int = 0
    phases: tuple[tuple[float, float], ...] = ()

    def phase(self, t: float) -> tuple[float, float]:
        """The rate scale in force at ``t`` and when the next phase starts (infinity: none)."""
        scale, nxt = 1.0, math.inf
        for start, s in sorted(self.phases):
            if start <= t:
                scale = s
            else:
                nxt = start
                break
        return scale, nxt


@dataclass(frozen=True)
class JobRecord:
    """One finished job: its class (``background-compute``/``background-comm`` for background jobs), arrival,
    completion time, time spent waiting in server and link queues, and how many servers it used."""

    klass: str
    arrival: float
    jct: float
    queued: float
    servers: int


class _Spec:
    """A DAG as index lists for the event loop."""

    def __init__(self, dag: Dag, nu: float):
        index = {t: i for i, t in enumerate(dag.tasks)}
        self.index = index
        self.time = (np.asarray(dag.ops) / nu).tolist()
        self.preds = [[index[p] for p in dag.preds[t]] for t in dag.tasks]
        self.succs = [[(index[s], dag.bytes[(t, s)]) for s in dag.succs[t]] for t in dag.tasks]
        self.source, self.sink = index[dag.source], index[dag.sink]
        self.critical = [0.0] * len(dag.tasks)  # longest compute path from a task to the sink, itself included
        for t in reversed(dag.topological_order):
            i = index[t]
            self.critical[i] = self.time[i] + max((self.critical[s] for s, _ in self.succs[i]), default=0.0)


class _Job:
    __slots__ = ("id", "klass", "arrival", "spec", "where", "missing", "left", "queued", "running", "ready", "work")

    def __init__(self, id: int, klass: str, arrival: float, spec: _Spec):
        self.id, self.klass, self.arrival, self.spec = id, klass, arrival, spec
        n = len(spec.time)
        self.where = [-1] * n
        self.missing = [len(p) for p in spec.preds]  # inputs not yet on the task's server
        self.left = [len(p) for p in spec.preds]     # parents not yet computed (Spark's readiness)
        self.queued, self.running = 0.0, 0
        self.ready: deque[tuple[int, float]] = deque()  # Spark, SJF-CP: (task, since) waiting for a server
        self.work = sum(spec.time)  # SJF-CP: compute not yet done


class _World:
    """Servers, the link and the jobs in flight."""

    def __init__(self, cluster: Cluster, workload: Workload, placer: Placer | Controller | None,
                 epoch_s: float | None = None, on_epoch: Callable[[float, dict[str, float]], object] | None = None,
                 live: str = "spark"):
        if live not in LIVE:
            raise ValueError(f"live scheduler {live!r} is not one of {LIVE}")
        self.c, self.w, self.placer = cluster, workload, placer
        self.sjf = live == "sjf_cp"
        if isinstance(placer, Controller):
            self._place = lambda query: placer.on_arrival(self.loop.now, query)
        elif placer is not None:
            self._place = placer.decide
        self.epoch_s, self.on_epoch = epoch_s, on_epoch
        self.counts = dict.fromkeys(workload.classes, 0)
        self.loop = EventLoop()
        self.arrivals = np.random.default_rng((workload.seed, 0))  # the same jobs for every scheme
        self.rng = np.random.default_rng((workload.seed, 1))       # placement draws of the world itself
        self.specs = {k: _Spec(dag, cluster.nu) for k, (dag, _) in workload.classes.items()}
        self.specs[BACKGROUND_COMPUTE] = _Spec(Dag.build(BACKGROUND_COMPUTE, {"task": cluster.bg_compute_ops}, {}),
                                               cluster.nu)
        self.servers = tuple(range(cluster.servers))
        self.queue: list[list] = [[] for _ in self.servers]  # heaps of (job arrival, job id, seq, ...)
        self._seq = 0
        self.busy = [False] * cluster.servers
        self.link: deque = deque()
        self.link_busy = False
        self.link_busy_s = 0.0  # the link's busy time between the warm-up and the horizon
        self.records: list[JobRecord] = []
        self.fair: list[tuple[float, int]] = []  # (priority, job id) of jobs with ready tasks, lazy: Spark's
        # priority is its running tasks, SJF-CP's its remaining work
        self.jobs: dict[int, _Job] = {}
        self._ids = 0

    def run(self) -> list[JobRecord]:
        streams: list[tuple[float, Callable[[], None]]] = [(rate, lambda k=k: self._arrive(k))
                                                           for k, (_, rate) in self.w.classes.items()]
        streams.append((self.c.bg_compute_rate, lambda: self._arrive(BACKGROUND_COMPUTE)))
        streams.append((self.c.bg_comm_rate, self._background_comm))
        for rate, fire in streams:
            if rate > 0:
                self._next(rate, fire)
        if self.epoch_s and self.on_epoch:
            self.loop.at(self.epoch_s, self._epoch)
        self.loop.run()
        return [r for r in self.records if r.arrival >= self.w.warmup_s]

    def _next(self, rate: float, fire: Callable[[], None]) -> None:
        """Schedule the stream's next arrival; at a phase change draw afresh (exact: arrivals are memoryless)."""
        scale, change = self.w.phase(self.loop.now)
        t = self.loop.now + self.arrivals.exponential(1 / (rate * scale)) if scale > 0 else math.inf
        if t >= change and change < self.w.horizon_s:
            self.loop.at(change, lambda: self._next(rate, fire))
        elif t < self.w.horizon_s:
            self.loop.at(t, lambda: (fire(), self._next(rate, fire)))

    def _epoch(self) -> None:
        """Hand the rates measured over the last epoch to the controller's world callback."""
        self.on_epoch(self.loop.now, {k: n / self.epoch_s for k, n in self.counts.items()})
        self.counts = dict.fromkeys(self.counts, 0)
        if self.loop.now + self.epoch_s < self.w.horizon_s:
            self.loop.after(self.epoch_s, self._epoch)

    def _arrive(self, klass: str) -> None:
        spec = self.specs[klass]
        job = _Job(self._ids, klass, self.loop.now, spec)
        self._ids += 1
        self.jobs[job.id] = job
        if klass in self.counts:
            self.counts[klass] += 1
        if self.placer is None:
            self._ready(job, spec.source)
            return
        if klass == BACKGROUND_COMPUTE:
            job.where[0] = int(self.rng.integers(self.c.servers))
        else:
            for t, s in self._place(Query(job.id, klass, self.servers)).servers:
                job.where[spec.index[t]] = s
        self._enqueue(job, spec.source)

    def _background_comm(self) -> None:
        self._send((None, 0, self.c.bg_comm_bytes / self.c.mu, self.loop.now))

    # -- servers (placed tasks) ----------------------------------------------------------------------------------
    def _enqueue(self, job: _Job, task: int) -> None:
        server = job.where[task]
        self._seq += 1
        heapq.heappush(self.queue[server], (job.arrival, job.id, self._seq, job, task, self.loop.now))
        if not self.busy[server]:
            self._start(server)

    def _start(self, server: int) -> None:
        if not self.queue[server]:
            self.busy[server] = False
            return
        self.busy[server] = True
        *_, job, task, since = heapq.heappop(self.queue[server])
        job.queued += self.loop.now - since
        self.loop.after(job.spec.time[task], lambda: self._done(server, job, task))

    def _done(self, server: int, job: _Job, task: int) -> None:
        spec = job.spec
        if task == spec.sink:
            del self.jobs[job.id]
            self.records.append(JobRecord(job.klass, job.arrival, self.loop.now - job.arrival, job.queued,
                                          len(set(job.where))))
        if self.placer is None:
            job.running -= 1
            job.work -= spec.time[task]
            if self.sjf and job.ready:  # less work left: a higher priority than its queued entry's
                heapq.heappush(self.fair, (job.work, job.id))
            for succ, _ in spec.succs[task]:
                job.left[succ] -= 1
                if job.left[succ] == 0:
                    self._ready(job, succ)
            self.busy[server] = False
            self._dispatch()
            return
        for succ, size in spec.succs[task]:
            if job.where[succ] == server or size == 0:
                self._arrived(job, succ)
            else:
                self._send((job, succ, size / self.c.mu, self.loop.now))
        self._start(server)

    def _arrived(self, job: _Job, task: int) -> None:
        job.missing[task] -= 1
        if job.missing[task] == 0:
            if self.placer is None:
                self._run(job, task)
            else:
                self._enqueue(job, task)

    # -- the link ------------------------------------------------------------------------------------------------
    def _send(self, item: tuple) -> None:
        self.link.append(item)
        if not self.link_busy:
            self._transmit()

    def _transmit(self) -> None:
        if not self.link:
            self.link_busy = False
            return
        self.link_busy = True
        job, task, length, since = self.link.popleft()
        now = self.loop.now
        self.link_busy_s += max(0.0, min(now + length, self.w.horizon_s) - max(now, self.w.warmup_s))
        if job is None:  # a background transfer is a whole job
            self.loop.after(length, lambda: (self.records.append(
                JobRecord(BACKGROUND_COMM, since, self.loop.now - since, self.loop.now - since - length, 0)),
                self._transmit()))
            return
        job.queued += self.loop.now - since
        self.loop.after(length, lambda: (self._arrived(job, task), self._transmit()))

    # -- Spark's fair scheduler and SJF-CP (live state) ----------------------------------------------------------
    def _priority(self, job: _Job) -> float:
        return job.work if self.sjf else job.running

    def _ready(self, job: _Job, task: int) -> None:
        job.ready.append((task, self.loop.now))
        if len(job.ready) == 1:
            heapq.heappush(self.fair, (self._priority(job), job.id))
        self._dispatch()

    def _next_ready(self, job: _Job) -> tuple[int, float]:
        """Spark: the job's oldest ready task; SJF-CP: the one with the longest critical path."""
        if not self.sjf:
            return job.ready.popleft()
        best = max(range(len(job.ready)), key=lambda i: job.spec.critical[job.ready[i][0]])
        job.ready.rotate(-best)
        item = job.ready.popleft()
        job.ready.rotate(best)
        return item

    def _dispatch(self) -> None:
        free = [s for s in self.servers if not self.busy[s]]
        while free and self.fair:
            key, jid = heapq.heappop(self.fair)
            job = self.jobs.get(jid)
            if job is None or not job.ready:
                continue
            if key != self._priority(job):  # stale entry: its share (or remaining work) changed since
                if not self.sjf:
                    heapq.heappush(self.fair, (job.running, jid))
                continue
            task, since = self._next_ready(job)
            job.queued += self.loop.now - since
            server = free.pop(int(self.rng.integers(len(free))))
            self.busy[server] = True
            job.running += 1
            job.where[task] = server
            if job.ready:
                heapq.heappush(self.fair, (self._priority(job), jid))
            job.missing[task] = 0
            for p in job.spec.preds[task]:
                if job.where[p] != server:
                    job.missing[task] += 1
                    size = dict(job.spec.succs[p])[task]
                    self._send((job, task, size / self.c.mu, self.loop.now))
            if job.missing[task] == 0:
                self._run(job, task)

    def _run(self, job: _Job, task: int) -> None:
        server = job.where[task]
        self.loop.after(job.spec.time[task], lambda: self._done(server, job, task))


def simulate(cluster: Cluster, workload: Workload, placer: Placer | Controller | None, *,
             epoch_s: float | None = None,
             on_epoch: Callable[[float, dict[str, float]], object] | None = None,
             live: str = "spark", observed: dict[str, float] | None = None) -> list[JobRecord]:
    """Run one scheme (``placer=None``: the live-state scheduler ``live``, Spark's fair scheduler or SJF-CP); the
    jobs that arrived after the warm-up. ``observed`` (a dict) receives ``link_rho``: the share of the time
    between the warm-up and the horizon the link spent transferring (the ρ the scheme really put on it).

    ``on_epoch(now, measured_rates)`` runs every ``epoch_s`` seconds of arrivals (e.g. to drive a controller's
    ``on_epoch`` and install re-solved θ).
    """
    world = _World(cluster, workload, placer, epoch_s, on_epoch, live)
    records = world.run()
    if observed is not None:
        observed["link_rho"] = world.link_busy_s / max(1e-12, workload.horizon_s - workload.warmup_s)
    return records
