"""Salus on one device: admit jobs into GPU lanes and switch them at iteration boundaries (thesis Ch. 2).

P. Yu, *Application-Aware Scheduling in Deep Learning Software Stacks*, PhD thesis, U. Michigan, 2022,
Ch. 2 (= Salus, MLSys'20): the job life cycle of Fig. 2.3 — a job asks the memory manager for a lane
(Algorithm 2.1; "this process can block, and the session will be queued"), then its iterations are
scheduled lane by lane by the iteration scheduler (FIFO, PACK, SRTF, FAIR; §2.4).

``SalusController`` is a ``gpu.contract.Controller``: the world (``gpu.sim.salus.run`` or the torch executor
``tasks.salus.executor``) calls

* ``on_arrival(now, job)`` — a job asks for a lane;
* ``on_iteration(now, job_id, gpu_s)`` — the job's iteration ended after ``gpu_s`` seconds of GPU time (measured:
  SRTF ranks by it, ``gpu.schedulers.salus.estimates``; FAIR charges it);
* ``on_job_done(now, job_id, gpu_s)`` — the job left (finished, failed or killed, mid-iteration or not),
* ``on_wake(now)`` — time passed (at ``token_deadline()``): a job that has held its lane's token past its bound
  loses it (``gpu.schedulers.salus.overrun``: its lane is fenced, the lane's other jobs go on beside it),

and applies the returned ``SalusStep``: who was admitted where, who waits, which lanes were laid out anew
(auto-defragmentation) and which job runs the next iteration of each free lane. Salus "is event-driven,
and reacts when there are jobs arriving or finishing, or at iteration boundaries" (§2.3.3.2): so is this.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from gpu.errors import ConfigError
from gpu.schedulers.salus.estimates import IterationClock
from gpu.schedulers.salus.lanes import LaneChoice, LaneManager, LaneMove, LaneView, Margins
from gpu.schedulers.salus.overrun import Holding, Revoked, TokenBound, check_floor
from gpu.schedulers.salus.policies import Candidate, LanePolicy, LaneSnapshot, make_policy

_LANE_CAPS = {"exclusive": (1, 1), "one_lane": (1, None), "lanes": (None, None)}  # (max_lanes, max_jobs)


@dataclass(frozen=True)
class SalusJob:
    """A training or inference job as Salus admits it: declared persistent and ephemeral memory (MB).

    ``expected_s``: declared total GPU time, SRTF's prior until the job's iterations are measured (§2.4.2,
    ``gpu.schedulers.salus.estimates``); ``iterations``: how many iterations it runs, where known on arrival (a
    simulated job; a torch job says so with its first ``Ask``); ``weight``: weighted-FAIR share;
    ``on_demand``: the job has an iteration to run only while an ``Ask`` for it waits — an inference job
    between queries (§2.5.3), or a real job that has not yet reached its next iteration boundary; otherwise
    (simulated training) its next iteration is always ready. ``token_floor_s``: the least time it may hold its
    lane's token before losing it (default: the controller's ``TokenBound.floor_s``), e.g. for a first iteration
    that compiles for minutes.
    Example: ``SalusJob("resnet50_50", persistent_mb=340, ephemeral_mb=5200, expected_s=900)``.
    """

    job_id: str
    persistent_mb: float
    ephemeral_mb: float
    expected_s: float | None = None
    weight: float = 1.0
    on_demand: bool = False
    token_floor_s: float | None = None
    iterations: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise ConfigError("job_id", self.job_id, "must be a non-empty name")
        _check_iterations(self.iterations, f"jobs[{self.job_id}].iterations")
        for name in ("persistent_mb", "ephemeral_mb", "expected_s", "weight"):
            v = getattr(self, name)
            if v is None and name == "expected_s":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"jobs[{self.job_id}].{name}", v, "must be a finite number > 0")
        if self.token_floor_s is not None:
            check_floor(self.token_floor_s, f"jobs[{self.job_id}].token_floor_s")


def _check_iterations(value: int | None, field: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(field, value, "must be a whole number of iterations >= 1")


@dataclass(frozen=True)
class Ask:
    """An ``on_demand`` job asks for one more iteration (a query arrived, or the job reached a boundary).

    ``iterations``: the job's loop is starting and will run this many iterations (``salus_iterations(n)`` sends
    ``n`` with its first ask), so SRTF can multiply its measured iteration time by the iterations left."""

    job_id: str
    iterations: int | None = None

    def __post_init__(self) -> None:
        _check_iterations(self.iterations, f"jobs[{self.job_id}].iterations")


@dataclass(frozen=True)
class Profiled:
    """A job's profiling iterations are over (thesis Alg. 2.1 needs ``P`` and ``E``; where a job declares
    none they are measured over its first iterations): its reservation is replaced by the measured sizes (MB)
    and it is re-admitted with Algorithm 2.1 *before* any queued job, because its persistent memory is
    already resident on the device. The job must not hold its lane's token (its iteration has ended)."""

    job_id: str
    persistent_mb: float
    ephemeral_mb: float


@dataclass(frozen=True)
class Admission:
    """A job got a lane: Algorithm 2.1's outcome (``new``/``join``/``grow``) and the lane."""

    job_id: str
    lane_id: int
    outcome: str


@dataclass(frozen=True)
class Run:
    """The job whose next iteration runs in this lane now (it holds the lane's token until its boundary)."""

    lane_id: int
    job_id: str


@dataclass(frozen=True)
class SalusStep:
    """One decision: admissions, jobs newly queued (Alg. 2.1 "not found"), lane layout changes, runs, and token
    holders that lost the token past their bound (``on_wake``)."""

    admitted: tuple[Admission, ...] = ()
    queued: tuple[str, ...] = ()
    moves: tuple[LaneMove, ...] = ()
    runs: tuple[Run, ...] = ()
    revoked: tuple[Revoked, ...] = ()


@dataclass
class _JobState:
    job: SalusJob
    seq: int
    p: float
    e: float
    served_s: float = 0.0
    consumed_s: float = 0.0
    last_run: int = -1
    pending: int = 0  # Asks waiting (on-demand jobs only)
    resident: bool = False  # its persistent memory is on the device already (re-admitted after profiling)
    longest_s: float = 0.0  # its longest measured iteration (the token bound follows it)
    granted_at: float = 0.0  # when it was last given its lane's token
    revoked_at: float | None = None  # when it lost the token mid-iteration (None: it did not)
    split: bool = False  # its lanemates went on in a lane of their own meanwhile
    clock: IterationClock = field(default_factory=IterationClock)  # measured iteration time, iterations left

    @property
    def has_work(self) -> bool:
        return not self.job.on_demand or self.pending > 0

    def candidate(self) -> Candidate:
        return Candidate(self.job.job_id, self.seq, self.served_s, self.remaining_s, self.job.weight, self.last_run)

    @property
    def remaining_s(self) -> float:
        return self.clock.remaining_s(self.job.expected_s, self.consumed_s)


@dataclass
class _Book:
    jobs: dict[str, _JobState] = field(default_factory=dict)  # admitted and queued
    queue: list[str] = field(default_factory=list)
    busy: dict[int, str] = field(default_factory=dict)  # lane -> job running an iteration there


class SalusController:
    """Salus's memory manager + iteration scheduler for one device (``gpu.contract.Controller``).

    Args:
        capacity_mb: the device's memory ``C``.
        policy: ``"fifo" | "pack" | "srtf" | "fair" | "weighted_fair"`` or a ``LanePolicy`` object.
        margins: safety margins (default ``P`` x 1.1, ``P+E`` x 1.05, 300 MB reserve).
        admission: override the policy's admission (``exclusive``/``one_lane``/``lanes``).
        max_jobs: admit at most this many jobs at once (a process-mode executor has that many workers).
        token_bound: how long a job may hold its lane's token (``gpu.schedulers.salus.overrun``).
    """

    system = "salus"
    hooks = ("on_arrival", "on_iteration", "on_job_done", "on_wake")

    def __init__(self, capacity_mb: float, policy: str | LanePolicy = "pack", margins: Margins = Margins(),
                 admission: str | None = None, max_jobs: int | None = None, token_bound: TokenBound = TokenBound()):
        self.rule: LanePolicy = make_policy(policy, admission) if isinstance(policy, str) else policy
        self.policy = self.rule.name
        max_lanes, cap = _LANE_CAPS[self.rule.admission]
        if max_jobs is not None and (isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1):
            raise ConfigError("max_jobs", max_jobs, "must be a whole number >= 1 (or None for no cap)")
        caps = [c for c in (cap, max_jobs) if c is not None]
        max_jobs = min(caps) if caps else None
        self.lanes = LaneManager(capacity_mb, margins, max_lanes=max_lanes, max_jobs=max_jobs)
        if not isinstance(token_bound, TokenBound):
            raise ConfigError("token_bound", token_bound, "must be a gpu.schedulers.salus.overrun.TokenBound")
        self.token_bound = token_bound
        self._book = _Book()
        self._seq = 0
        self._iterations = 0

    # --- hooks ------------------------------------------------------------------------------------------
    def on_arrival(self, now: float, job: SalusJob | Ask | Profiled) -> SalusStep:
        """A job: check it (bad sizes, never fits, SRTF without a time → error, nothing changed), then admit
        it with Algorithm 2.1 or queue it, and start iterations on free lanes. An ``Ask``: its on-demand job has
        one more iteration to run. ``Profiled``: the job comes back with its measured sizes (first in line)."""
        if isinstance(job, Ask):
            state = self._known(job.job_id)
            if job.iterations is not None:
                state.clock.start(job.iterations, state.job.expected_s)
            if state.last_run == -1 and state.pending == 0 and job.job_id in self.lanes.lane_of:
                # its first iteration: the job joins the lane's competition only now, so FAIR's counters
                # restart as on admission (a job admitted long before its first iteration gets no catch-up)
                self._restart_service(self.lanes.lane_of[job.job_id])
            state.pending += 1
            return self._advance(now, (), ())
        if isinstance(job, Profiled):
            return self._readmit(now, job)
        if job.job_id in self._book.jobs:
            raise ConfigError("job_id", job.job_id, "already submitted to this device")
        if self.rule.needs_expected_time and job.expected_s is None:
            raise ConfigError(f"jobs[{job.job_id}].expected_s", None, f"{self.policy} needs each job's expected time")
        p, e = self.lanes.charge(job.job_id, job.persistent_mb, job.ephemeral_mb)
        self._book.jobs[job.job_id] = state = _JobState(job, self._seq, p, e)
        if job.iterations is not None:
            state.clock.start(job.iterations, job.expected_s)
        self._seq += 1
        self._book.queue.append(job.job_id)
        admitted = self._admit_queued()
        queued = () if any(a.job_id == job.job_id for a in admitted) else (job.job_id,)
        return self._advance(now, admitted, queued)

    def on_iteration(self, now: float, job_id: str, gpu_s: float, more: bool = False, iterations: int = 1
                     ) -> SalusStep:
        """The job's iteration ended after ``gpu_s`` measured seconds: charge its service, update its measured
        iteration time and iterations left (SRTF's estimate), free its lane, re-lay lanes, pick next iterations.

        ``iterations``: how many iterations ``gpu_s`` covered (a simulator that steps several at once).
        ``more``: an on-demand job asks for its next iteration in the same breath, so the policy sees it
        waiting (a real job would otherwise lose the token to whoever asked while it crossed the boundary).
        A job that lost the token during this iteration (``on_wake``) has now given its ephemeral memory back:
        its fence goes, and if its lanemates went on in a lane of their own it is re-admitted (Algorithm 2.1,
        before any queued job, as after profiling) to wait for the token again.
        """
        state = self._known(job_id)
        revoked = state.revoked_at is not None
        self._finish_iteration(job_id, gpu_s, must_run=True, iterations=iterations)
        if more:
            state.pending += 1
        if not revoked:
            return self._advance(now, (), ())
        state.revoked_at, split, state.split = None, state.split, False
        self.lanes.unfence(job_id)
        if not split:
            return self._advance(now, (), ())
        self.lanes.release(job_id)
        state.resident = True
        self._book.queue.append(job_id)
        admitted = self._admit_queued()
        queued = () if any(a.job_id == job_id for a in admitted) else (job_id,)
        return self._advance(now, admitted, queued)

    def on_job_done(self, now: float, job_id: str, gpu_s: float = 0.0) -> SalusStep:
        """The job left (done, failed, killed; mid-iteration or queued): free its memory and lane, shrink the
        lane, retry queued jobs (FIFO, or the policy's order), then pick next iterations."""
        self._known(job_id)
        if job_id in self._book.queue:
            self._book.queue.remove(job_id)
        else:
            self._finish_iteration(job_id, gpu_s, must_run=False)
            self.lanes.release(job_id)
        del self._book.jobs[job_id]
        return self._advance(now, self._admit_queued(), ())

    def on_wake(self, now: float) -> SalusStep:
        """Every job that has held its lane's token longer than its bound loses it: its lane is fenced (kept for
        the iteration it may still be running) and the lane's other jobs go on in a lane of their own as soon as
        Eq. 2.1 has room (``gpu.schedulers.salus.overrun``); the other lanes never waited. Call it at
        ``token_deadline()``."""
        revoked = []
        for hold in self.token_holders(now):
            if not hold.revoked and hold.held_s > hold.bound_s:
                self._book.jobs[hold.job_id].revoked_at = now
                self.lanes.fence(hold.job_id)
                revoked.append(Revoked(hold.job_id, hold.lane_id, hold.held_s, hold.bound_s))
        return dataclasses.replace(self._advance(now, (), ()), revoked=tuple(revoked))

    # --- what a world asks --------------------------------------------------------------------------------
    @property
    def queue(self) -> tuple[str, ...]:
        return tuple(self._book.queue)

    @property
    def running(self) -> dict[int, str]:
        return dict(self._book.busy)

    def lane_views(self) -> tuple[LaneView, ...]:
        return self.lanes.lanes()

    def consumed_s(self, job_id: str) -> float:
        return self._known(job_id).consumed_s

    def remaining_s(self, job_id: str) -> float:
        """The GPU time the job still needs as SRTF ranks it (``gpu.schedulers.salus.estimates``)."""
        return self._known(job_id).remaining_s

    def iteration_s(self, job_id: str) -> float | None:
        """The job's seconds per iteration as SRTF estimates them: its prior (declared total / iterations), moved
        towards each steady iteration measured (None: no prior, nothing measured yet)."""
        return self._known(job_id).clock.per_iteration_s

    def token_holders(self, now: float) -> tuple[Holding, ...]:
        """Each busy lane's token holder: held since when, its bound, whether it has lost the token."""
        return tuple(Holding(lane_id, job_id, now - self._book.jobs[job_id].granted_at,
                             self._bound(self._book.jobs[job_id]), self._book.jobs[job_id].revoked_at is not None)
                     for lane_id, job_id in self._book.busy.items())

    def token_deadline(self) -> float | None:
        """When the next holder that has not lost its token passes its bound (None: no such holder)."""
        holders = [self._book.jobs[job_id] for job_id in self._book.busy.values()]
        return min((s.granted_at + self._bound(s) for s in holders if s.revoked_at is None), default=None)

    def _bound(self, state: _JobState) -> float:
        return self.token_bound.limit_s(state.longest_s, state.job.token_floor_s)

    # --- helpers --------------------------------------------------------------------------------------------
    def _known(self, job_id: str) -> _JobState:
        if job_id not in self._book.jobs:
            raise ConfigError("job_id", job_id, "unknown to this device's Salus controller")
        return self._book.jobs[job_id]

    def _finish_iteration(self, job_id: str, gpu_s: float, must_run: bool, iterations: int = 1) -> None:
        state = self._known(job_id)
        if isinstance(gpu_s, bool) or not isinstance(gpu_s, (int, float)) or not math.isfinite(gpu_s) or gpu_s < 0:
            raise ConfigError("gpu_s", gpu_s, "must be a finite number of seconds >= 0")
        _check_iterations(iterations, "iterations")
        lane = self.lanes.lane_of.get(job_id)
        if self._book.busy.get(lane) != job_id:
            if must_run:
                raise ConfigError("job_id", job_id, "ended an iteration it was never told to run")
            return
        del self._book.busy[lane]
        revoked = state.revoked_at is not None
        if revoked:  # it is charged the time it held the lane alone, not its stop
            gpu_s = min(gpu_s, state.revoked_at - state.granted_at)
        else:
            state.longest_s = max(state.longest_s, gpu_s)
        state.clock.observe(gpu_s, iterations, measured=not revoked)
        state.served_s += gpu_s
        state.consumed_s += gpu_s

    def _readmit(self, now: float, profiled: Profiled) -> SalusStep:
        state = self._known(profiled.job_id)
        lane = self.lanes.lane_of.get(profiled.job_id)
        if profiled.job_id in self._book.queue or self._book.busy.get(lane) == profiled.job_id:
            raise ConfigError("job_id", profiled.job_id, "is queued or holds its lane's token; cannot be re-admitted")
        p, e = self.lanes.charge(profiled.job_id, profiled.persistent_mb, profiled.ephemeral_mb)
        self.lanes.release(profiled.job_id)
        state.p, state.e, state.resident = p, e, True
        self._book.queue.append(profiled.job_id)
        admitted = self._admit_queued()
        queued = () if any(a.job_id == profiled.job_id for a in admitted) else (profiled.job_id,)
        return self._advance(now, admitted, queued)

    def _admit_queued(self) -> tuple[Admission, ...]:
        """Try queued jobs in the policy's queue order (jobs whose memory is already resident first); a job
        stays queued only if Alg. 2.1 finds nothing."""
        admitted = []
        order = sorted(self._book.queue, key=lambda j: (not self._book.jobs[j].resident,
                                                         self.rule.queue_key(self._book.jobs[j].candidate())))
        for job_id in order:
            state = self._book.jobs[job_id]
            choice: LaneChoice = self.lanes.admit(job_id, state.p, state.e)
            if choice.outcome == "not_found":
                continue
            self._book.queue.remove(job_id)
            self._restart_service(choice.lane_id)  # a job joined: FAIR's counters restart (authors' code)
            admitted.append(Admission(job_id, choice.lane_id, choice.outcome))
        return tuple(admitted)

    def _restart_service(self, lane_id: int) -> None:
        for j in self.lanes.jobs_in(lane_id):
            self._book.jobs[j].served_s = 0.0

    def _advance(self, now: float, admitted: tuple[Admission, ...], queued: tuple[str, ...]) -> SalusStep:
        """Move the lanemates of fenced holders to lanes of their own where Eq. 2.1 now has room, re-lay idle lanes
        (auto-defragmentation), then give each free, ready lane its next iteration."""
        for lane_id, job_id in self.lanes.fenced.items():
            if self.lanes.split_off(job_id) is not None:
                self._book.jobs[job_id].split = True
        views = self.lanes.lanes()
        moves = self.lanes.settle({v.lane_id for v in views if v.lane_id not in self._book.busy})
        runs = []
        for view in self.lanes.lanes():
            if view.lane_id in self._book.busy or not view.jobs or not self.lanes.ready(view.lane_id):
                continue
            ready = tuple(self._book.jobs[j].candidate() for j in view.jobs if self._book.jobs[j].has_work)
            if not ready:
                continue
            job_id = self.rule.decide(LaneSnapshot(view.lane_id, ready))
            self._book.busy[view.lane_id] = job_id
            state = self._book.jobs[job_id]
            state.last_run, state.pending = self._iterations, max(0, state.pending - 1)
            state.granted_at = now
            self._iterations += 1
            runs.append(Run(view.lane_id, job_id))
        return SalusStep(admitted, queued, moves, tuple(runs))


__all__ = ["Admission", "Ask", "Profiled", "Run", "SalusController", "SalusJob", "SalusStep", "Margins"]
