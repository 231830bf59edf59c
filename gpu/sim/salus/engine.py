"""The Salus simulator's world: jobs iterate on one device under a ``SalusController`` (thesis Ch. 2).

The world owns the clock (``gpu.sim.events.EventLoop``) and the work; the controller owns admission (Alg. 2.1)
and which iteration runs next. An iteration is solo time ``iter_s`` of work; lanes with an iteration in
flight share compute, each progressing at ``min(1, 1 / sum u)`` of its solo speed (processor sharing, our
model: Salus does not schedule compute across lanes, §5.1). Whenever the set of running iterations changes,
every running iteration's remaining work is advanced and its completion re-scheduled, so the model is exact.

``quantum_s`` groups consecutive iterations of a job into one simulated step of at least that many seconds
(the switching granularity becomes the step), which keeps long traces of 10 ms iterations affordable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpu.schedulers.salus.controller import Ask, SalusController, SalusStep
from gpu.sim.events import EventHandle, EventLoop
from gpu.sim.salus.workloads import TraceJob


@dataclass(frozen=True)
class JobRecord:
    """One job's outcome: times in seconds on the simulation clock."""

    job_id: str
    arrival_s: float
    first_run_s: float
    finish_s: float

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def queuing_s(self) -> float:
        return self.first_run_s - self.arrival_s


@dataclass(frozen=True)
class Segment:
    """An interval a job's iteration(s) ran in a lane (the lane Gantt chart)."""

    lane_id: int
    job_id: str
    start_s: float
    end_s: float
    work_s: float


@dataclass(frozen=True)
class SimResult:
    """What one policy did on one trace."""

    policy: str
    jobs: tuple[JobRecord, ...]
    segments: tuple[Segment, ...]
    queued_on_arrival: int
    peak_lanes: int
    peak_memory_mb: float
    capacity_mb: float

    @property
    def makespan_s(self) -> float:
        return max(j.finish_s for j in self.jobs) - min(j.arrival_s for j in self.jobs)

    def summary(self) -> dict[str, float]:
        jct = np.array([j.jct_s for j in self.jobs])
        return {"makespan_s": self.makespan_s, "avg_queuing_s": float(np.mean([j.queuing_s for j in self.jobs])),
                "avg_jct_s": float(jct.mean()), "p95_jct_s": float(np.percentile(jct, 95)),
                "queued_on_arrival": float(self.queued_on_arrival), "peak_lanes": float(self.peak_lanes),
                "peak_memory_fraction": self.peak_memory_mb / self.capacity_mb}

    def throughput(self, job_id: str, start_s: float, end_s: float) -> float:
        """Solo-seconds of work the job did per second in ``[start_s, end_s)`` (1.0 = the device alone)."""
        done = 0.0
        for s in self.segments:
            if s.job_id == job_id and s.end_s > start_s and s.start_s < end_s:
                overlap = min(s.end_s, end_s) - max(s.start_s, start_s)
                done += s.work_s * overlap / (s.end_s - s.start_s)
        return done / (end_s - start_s)


@dataclass
class _Flight:
    job_id: str
    started: float
    work: float
    left: float
    handle: EventHandle | None = None


@dataclass
class _World:
    loop: EventLoop
    ctl: SalusController
    jobs: dict[str, TraceJob]
    quantum_s: float
    left: dict[str, int] = field(default_factory=dict)
    flights: dict[int, _Flight] = field(default_factory=dict)
    last: float = 0.0
    first_run: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    segments: list[Segment] = field(default_factory=list)
    queued: int = 0
    peak_lanes: int = 0
    peak_mb: float = 0.0

    def rate(self) -> float:
        load = sum(self.jobs[f.job_id].u for f in self.flights.values())
        return min(1.0, 1.0 / load) if load > 0 else 1.0

    def advance(self) -> None:
        """Charge the work every running iteration did since the last change."""
        done = (self.loop.now - self.last) * self.rate()
        for f in self.flights.values():
            f.left = max(0.0, f.left - done)
        self.last = self.loop.now

    def reschedule(self) -> None:
        rate = self.rate()
        for lane, f in self.flights.items():
            if f.handle is not None:
                f.handle.cancel()
            f.handle = self.loop.after(f.left / rate, lambda lane=lane: self.end(lane))

    def apply(self, step: SalusStep) -> None:
        self.queued += len(step.queued)
        for run in step.runs:
            job = self.jobs[run.job_id]
            steps = 1 if job.salus.on_demand else min(self.left[run.job_id], max(1, math.ceil(self.quantum_s / job.iter_s)))
            self.first_run.setdefault(run.job_id, self.loop.now)
            work = steps * job.iter_s
            self.flights[run.lane_id] = _Flight(run.job_id, self.loop.now, work, work)
        views = self.ctl.lane_views()
        self.peak_lanes = max(self.peak_lanes, len(views))
        self.peak_mb = max(self.peak_mb, self.ctl.lanes.used_mb())

    def arrive(self, job: TraceJob | Ask) -> None:
        self.advance()
        self.apply(self.ctl.on_arrival(self.loop.now, job if isinstance(job, Ask) else job.salus))
        self.reschedule()

    def end(self, lane: int) -> None:
        self.advance()
        f = self.flights.pop(lane)
        job = self.jobs[f.job_id]
        self.segments.append(Segment(lane, f.job_id, f.started, self.loop.now, f.work))
        iterations = 1 if job.salus.on_demand else round(f.work / job.iter_s)
        self.left[f.job_id] -= iterations
        took = self.loop.now - f.started  # the step's GPU time as this world measures it (contention included)
        if self.left[f.job_id] <= 0:
            self.finish[f.job_id] = self.loop.now
            step = self.ctl.on_job_done(self.loop.now, f.job_id, took)
        else:
            step = self.ctl.on_iteration(self.loop.now, f.job_id, took, iterations=iterations)
        self.apply(step)
        self.reschedule()


def simulate(jobs: list[TraceJob], ctl: SalusController, quantum_s: float = 0.0,
             queries: list[tuple[float, str]] = ()) -> SimResult:
    """Run ``jobs`` (and inference ``queries``: ``(time, job_id)``) to completion under ``ctl``.

    Inference jobs finish after one iteration per query (their ``iterations`` = number of queries).
    """
    loop = EventLoop()
    world = _World(loop, ctl, {j.salus.job_id: j for j in jobs}, quantum_s)
    for j in jobs:
        world.left[j.salus.job_id] = j.iterations
        loop.at(j.arrival_s, lambda j=j: world.arrive(j), priority=0)
    for at, job_id in queries:
        loop.at(at, lambda job_id=job_id: world.arrive(Ask(job_id)), priority=1)
    loop.run()
    missing = [j for j in world.jobs if j not in world.finish]
    if missing:
        raise RuntimeError(f"simulation ended with jobs never finished: {missing[:5]}")
    records = tuple(JobRecord(j.salus.job_id, j.arrival_s, world.first_run[j.salus.job_id],
                              world.finish[j.salus.job_id]) for j in jobs)
    return SimResult(ctl.policy, records, tuple(world.segments), world.queued, world.peak_lanes, world.peak_mb,
                     ctl.lanes.capacity_mb)
