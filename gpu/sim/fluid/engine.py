"""Discrete-event execution of one tuning job on ``n`` simulated GPUs (the runtime model of thesis Eq. 3.2).

The same ``TuningSession``/executor a Prefect flow drives is driven here by ``gpu.sim.events.EventLoop``.
Progress model: a trial on ``k >= 1`` GPUs runs ``k / (t_1 beta**(k-1))`` iterations/s; a trial sharing a
GPU with ``p - 1`` others runs ``1 / (t_1 alpha**(p-1))`` (actual co-residents, not the nominal ``1/c``); a
resize stalls the trial for ``epsilon`` seconds (checkpoint + relaunch at an iteration boundary).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu.errors import GpuflowsError
from gpu.schedulers.fluid.controller import TrialPlacement, Step
from gpu.schedulers.fluid.session import Executor, TuningSession
from gpu.sim.events import EventHandle, EventLoop
from gpu.sim.fluid.workload import Workload
from gpu.schedulers.fluid.tuning.base import TuningAlgorithm


@dataclass(frozen=True)
class RunResult:
    """What one execution policy achieved on one tuning job."""

    policy: str
    makespan_s: float
    utilisation: float  # share of GPU-time with at least one trial resident
    efficiency: float  # single-GPU work (sum of t_1 * iterations) / (n * makespan)
    trials: int
    groups: int
    resizes: int
    best_loss: float
    timeline: tuple[tuple[float, int], ...] = field(repr=False, default=())  # (time, busy GPUs) after each event


@dataclass
class _Run:
    done: float = 0.0
    rate: float = 0.0
    stall_until: float = 0.0
    handle: EventHandle | None = None


class _Simulation:
    def __init__(self, session: TuningSession, workload: Workload, epsilon: float):
        self.session, self.workload, self.epsilon = session, workload, epsilon
        self.loop = EventLoop()
        self.runs: dict[str, _Run] = {}
        self.last = 0.0
        self.busy_time = 0.0
        self.work = 0.0
        self.resizes = 0
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]

    @property
    def executor(self) -> Executor:
        return self.session.executor

    def _busy_gpus(self) -> int:
        return len({g for p in self.executor.running.values() for g in p.gpus})

    def advance(self) -> None:
        now = self.loop.now
        self.busy_time += (now - self.last) * self._busy_gpus()
        for tid, r in self.runs.items():
            r.done += r.rate * max(0.0, now - max(self.last, r.stall_until))
            self.session.report_progress(tid, r.done)
        self.last = now

    def _rate(self, p: TrialPlacement, running: dict[str, TrialPlacement]) -> float:
        t = self.session.trial(p.trial_id)
        if p.width >= 1:
            k = len(p.gpus)
            return k / (t.iter_time_s * t.beta ** (k - 1))
        sharing = sum(1 for q in running.values() if p.gpus[0] in q.gpus)
        return 1.0 / (t.iter_time_s * t.alpha ** (sharing - 1))

    def apply(self, step: Step) -> None:
        now = self.loop.now
        for tid in step.stops:
            run = self.runs.pop(tid, None)
            if run and run.handle:
                run.handle.cancel()
        for p in step.starts:
            self.runs[p.trial_id] = _Run(stall_until=now)
        for p in step.resizes:
            self.runs[p.trial_id].stall_until = now + self.epsilon
            self.resizes += 1
        running = self.executor.running
        for tid, r in self.runs.items():
            r.rate = self._rate(running[tid], running)
            if r.handle:
                r.handle.cancel()
            left = max(0.0, self.session.trial(tid).budget - r.done) / r.rate
            r.handle = self.loop.at(max(now, r.stall_until) + left, lambda tid=tid: self.complete(tid))
        self.timeline.append((now, self._busy_gpus()))

    def complete(self, tid: str) -> None:
        self.advance()
        self.runs.pop(tid)
        trial = self.session.trial(tid)
        self.work += trial.budget * trial.iter_time_s
        self.apply(self.session.report_complete(self.loop.now, tid, self.workload.score(trial)))


def simulate(policy: str, algorithm: TuningAlgorithm, executor: Executor, workload: Workload, gpus: int,
             epsilon: float = 0.0) -> RunResult:
    """Run ``algorithm`` to completion under ``executor`` on ``gpus`` GPUs; return makespan and utilisation."""
    session = TuningSession(algorithm, executor, lambda trials: [workload.profile(t) for t in trials])
    sim = _Simulation(session, workload, epsilon)
    sim.apply(sim.session.start(sim.loop.now))
    sim.loop.run()
    if not sim.session.finished:
        raise GpuflowsError(f"policy {policy}: simulation stalled with work left (algorithm {algorithm.name})")
    makespan = sim.loop.now
    span = max(makespan, 1e-12)
    return RunResult(policy, makespan, sim.busy_time / (gpus * span), sim.work / (gpus * span),
                     len(sim.session.trials), sim.session.groups, sim.resizes, algorithm.best().score,
                     tuple(sim.timeline))
