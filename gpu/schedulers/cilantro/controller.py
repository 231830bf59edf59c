"""Cilantro's allocation round as one controller, driven by the simulator and by the Prefect flow (thesis ch. 3,
§3.3 Fig. 3.3, §3.4).

Fig. 3.3's loop: every round each job reports its load and performance; the reports update the job's
performance learner (an upper/lower confidence band of performance vs resources per unit load, §3.6) and
its load forecaster (a load UCB for the next round, §3.3); the policy decides the next round's allocation
from a frozen :class:`~gpu.schedulers.cilantro.types.Snapshot` built from them. :class:`CilantroRound`
owns that loop and nothing else: the world (``gpu.sim.cilantro.run`` with modelled outcomes, or
``flows.allocation_rounds`` with outcomes measured from torch work on pool slices) calls
``on_round(now, feedback)`` when a round ends and applies the returned :class:`RoundDecision`.

The decision for round ``r + 1`` is taken as soon as round ``r``'s feedback is in, and :meth:`save` keeps
it (``planned``), so a run resumed from a save continues with exactly the decision an uninterrupted run
would have applied (same learners, forecasts, policy state and RNG draws).

Example (one service, one trainer, a tenth of a GPU as the unit)::

    ctl = CilantroRound(jobs, make_policy("cilantro-njc"), capacity=1.0, unit=0.1, seed=0)
    d = ctl.on_round(0.0, {})                     # round 0: nothing measured yet
    d.allocation                                  # {"svc": 0.5, "trainer": 0.5}
    d = ctl.on_round(60.0, {"svc": JobReport(0.5, (40.0,), (0.93,), (0.08,)), "trainer": None})
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.policies import POLICIES
from gpu.schedulers.cilantro.learners import learner_from_state
from gpu.schedulers.cilantro.types import Feedback, JobSpec, JobView, AllocationPolicy, Snapshot


def policy_names() -> list[str]:
    """Every policy a round can run (the paper's names, Table 3.2)."""
    return list(POLICIES)


class Learner(Protocol):
    """A performance learner (``IntervalBinaryTree`` or ``SaturatingLearner``)."""

    def update(self, alloc: float, load: float, reward: float, sigma: float) -> None: ...

    def bounds(self, alloc_grid: np.ndarray, load: float) -> tuple[np.ndarray, np.ndarray]: ...

    def get_state(self) -> dict[str, Any]: ...


class LoadSource(Protocol):
    """Where the round's load UCBs come from: forecasters fed with the reports (:class:`LoadForecasts`), or a
    table computed once and shared by every policy of a simulation (``gpu.sim.cilantro.run``)."""

    def observe(self, job: str, loads: tuple[float, ...]) -> None: ...

    def ucb(self, job: str, round_index: int) -> float: ...

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True, eq=False)
class RoundJob:
    """A job as the round knows it.

    Args:
        spec: name, SLO, utility and weight.
        upper: resources per unit load beyond which the curve is flat (the learner's interval end); the
            demand cap of a job whose SLO is out of reach is ``upper · load UCB``.
        perf_bounds: the range performance can take, ``(0, 1)`` for SLO attainment, ``(0, inf)`` for throughput
            (what the feedback-only policies are shown).
        learner: builds the job's fresh learner (used for policies with ``learner == "online"``).
        truth: ``(alloc_grid, load) -> perf``, the true curve oracle policies are given; None where no world
            knows it (a flow measures performance, it is not told it).
    """

    spec: JobSpec
    upper: float
    perf_bounds: tuple[float, float]
    learner: Callable[[], Learner]
    truth: Callable[[np.ndarray, float], np.ndarray] | None = None

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class JobReport:
    """What one job measured over a round: the allocation it held and, per report period, its load,
    performance (SLO attainment or throughput) and the standard error of that performance."""

    alloc: float
    loads: tuple[float, ...]
    perf: tuple[float, ...]
    sigma: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.loads) == len(self.perf) == len(self.sigma):
            raise ConfigError("feedback", (len(self.loads), len(self.perf), len(self.sigma)),
                              "loads, perf and sigma need one value per report")


@dataclass(frozen=True)
class RoundDecision:
    """One round's allocation and what it was decided from, per job (plain values: logged and saved as JSON).

    ``perf_lcb``/``perf_ucb`` are the band the policy saw at the chosen allocation (learned, true or the
    global range, by the policy's kind); ``demands`` the demands a demand-based policy (NJC) computed.

    Example: ``RoundDecision(3, 180.0, {"svc": 0.45, "trainer": 0.55}, {"svc": 41.2, "trainer": 1.0},
    {"svc": 0.91, "trainer": 24.0}, {"svc": 0.97, "trainer": 29.5}, {"svc": 0.45})``.
    """

    round_index: int
    decided_at: float
    allocation: Mapping[str, float]
    load_ucb: Mapping[str, float]
    perf_lcb: Mapping[str, float]
    perf_ucb: Mapping[str, float]
    demands: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"round_index": self.round_index, "decided_at": self.decided_at, "allocation": dict(self.allocation),
                "load_ucb": dict(self.load_ucb), "perf_lcb": dict(self.perf_lcb), "perf_ucb": dict(self.perf_ucb),
                "demands": dict(self.demands)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RoundDecision:
        return cls(int(raw["round_index"]), float(raw["decided_at"]), dict(raw["allocation"]), dict(raw["load_ucb"]),
                   dict(raw["perf_lcb"]), dict(raw["perf_ucb"]), dict(raw.get("demands", {})))


class LoadForecasts:
    """One forecaster per job with a load (services); jobs without one (training, load ≡ 1) get UCB 1.

    The UCB of the next round is the forecaster's upper bound over the round's ``horizon`` report steps
    (§3.3: the allocation must hold for the whole round); before any report it is the job's nominal load.
    """

    def __init__(self, forecasters: Mapping[str, Any], nominal: Mapping[str, float], horizon: int):
        self.forecasters, self.nominal, self.horizon = dict(forecasters), dict(nominal), int(horizon)

    def observe(self, job: str, loads: tuple[float, ...]) -> None:
        fc = self.forecasters.get(job)
        if fc is not None:
            for load in loads:
                fc.update(load)

    def ucb(self, job: str, round_index: int) -> float:
        fc = self.forecasters.get(job)
        if fc is None:
            return 1.0
        return max(fc.forecast(self.horizon)[2] if fc.history else self.nominal[job], 1e-6)

    def get_state(self) -> dict[str, Any]:
        return {name: fc.get_state() for name, fc in self.forecasters.items()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        for name, fc in self.forecasters.items():
            fc.set_state(state[name])


class CilantroRound:
    """Cilantro's round controller (module docstring): ``on_round(now, feedback) -> RoundDecision``.

    ``policy`` is the policy's name (``gpu.contract.Controller``), ``rule`` the policy object; learners exist
    only for policies that read them (``rule.learner == "online"``).

    Args:
        jobs: the jobs, in a fixed order.
        policy: a fresh policy (``gpu.schedulers.cilantro.make_policy``).
        capacity: R, the pool size; unit: allocation granularity; max_change: B (None = unbounded).
        loads: where load UCBs come from (:class:`LoadForecasts` or a precomputed table).
        seed: seeds the policy's RNG (``default_rng([seed, 7])``).
        warmup_reports: the first reports of each job its learner ignores (§3.7: start-up transients).
    """

    system = "cilantro"
    hooks = ("on_round",)

    def __init__(self, jobs: tuple[RoundJob, ...], policy: AllocationPolicy, *, capacity: float, unit: float,
                 max_change: float | None, loads: LoadSource, seed: int = 0, warmup_reports: int = 0):
        if policy.learner == "oracle" and any(j.truth is None for j in jobs):
            missing = next(j.name for j in jobs if j.truth is None)
            raise ConfigError("policy", policy.name, f"an oracle needs each job's true curve and {missing!r} has none "
                                                     "(only the simulator knows true curves); choose a learning policy")
        self.jobs, self.rule, self.policy, self.loads = tuple(jobs), policy, policy.name, loads
        self.capacity, self.unit, self.max_change = float(capacity), float(unit), max_change
        self.warmup_reports = int(warmup_reports)
        self.grid = np.arange(int(math.floor(self.capacity / self.unit + 1e-9)) + 1) * self.unit
        self.rng = np.random.default_rng([seed, 7])
        self.learners: dict[str, Learner] = ({j.name: j.learner() for j in self.jobs}
                                             if policy.learner == "online" else {})
        self.next_round = 0
        self.previous: dict[str, float] | None = None
        self.seen = {j.name: 0 for j in self.jobs}
        self.feedback: dict[str, Feedback | None] = {j.name: None for j in self.jobs}
        self.planned: RoundDecision | None = None

    def on_round(self, now: float, feedback: Mapping[str, JobReport | None]) -> RoundDecision:
        """Fold the round that just ended into the learners and forecasts, then decide the next round.

        ``feedback`` maps job → its report (None or absent: the job failed or has not run yet; its learner and
        feedback stay as they were). Returns the decision for round ``next_round``.
        """
        if self.planned is not None:
            self.previous, self.next_round = dict(self.planned.allocation), self.planned.round_index + 1
        unknown = sorted(set(feedback) - set(self.seen))
        if unknown:
            raise ConfigError("feedback", unknown, f"not jobs of this round {sorted(self.seen)}")
        for name, rep in feedback.items():
            if rep is not None:
                self._fold(name, rep)
        self.planned = self._decide(now)
        return self.planned

    def _fold(self, name: str, rep: JobReport) -> None:
        learner = self.learners.get(name)
        for load, perf, sigma in zip(rep.loads, rep.perf, rep.sigma):
            self.seen[name] += 1
            if learner is not None and self.seen[name] > self.warmup_reports:
                learner.update(rep.alloc, load, perf, sigma)
        self.loads.observe(name, rep.loads)
        self.feedback[name] = Feedback(float(rep.alloc), float(np.mean(rep.loads)), float(np.mean(rep.perf)))

    def views(self, round_index: int) -> tuple[JobView, ...]:
        """Each job as the policy sees it this round: learned band (online), true curve (oracle) or the global
        range (feedback-only policies), at the job's load UCB."""
        out = []
        for job in self.jobs:
            ucb = self.loads.ucb(job.name, round_index)
            fb, cap = self.feedback[job.name], job.upper * ucb
            if self.rule.learner == "online":
                lcb, hi = self.learners[job.name].bounds(self.grid, ucb)
                out.append(JobView(job.spec, self.grid, lcb, hi, ucb, fb, demand_cap=cap))
            elif self.rule.learner == "oracle":
                truth = job.truth(self.grid, ucb)
                out.append(JobView(job.spec, self.grid, truth, truth, ucb, fb, demand_cap=cap))
            else:
                lo, hi = job.perf_bounds
                g = np.array([0.0, self.capacity])
                out.append(JobView(job.spec, g, np.full(2, lo), np.full(2, hi), ucb, fb, demand_cap=cap))
        return tuple(out)

    def _decide(self, now: float) -> RoundDecision:
        r = self.next_round
        views = self.views(r)
        snap = Snapshot(self.capacity, views, self.unit, self.previous, self.max_change, r)
        alloc = {k: round(float(v), 9) for k, v in self.rule.decide(snap, self.rng).items()}
        at = {v.name: (float(np.interp(alloc[v.name], v.alloc_grid, v.perf_lcb)),
                       float(np.interp(alloc[v.name], v.alloc_grid, v.perf_ucb))) for v in views}
        demands = self.rule.get_state().get("demands", {})
        return RoundDecision(r, float(now), alloc, {v.name: float(v.load_ucb) for v in views},
                             {n: lo for n, (lo, _) in at.items()}, {n: hi for n, (_, hi) in at.items()},
                             {k: float(v) for k, v in demands.items()})

    def save(self) -> dict[str, Any]:
        """Everything the round has learned, as plain JSON (the flow's state file holds these keys)."""
        return {"next_round": self.next_round, "previous": self.previous, "seen": dict(self.seen),
                "policy": self.rule.get_state(), "rng": self.rng.bit_generator.state,
                "learners": {k: v.get_state() for k, v in self.learners.items()},
                "forecasters": self.loads.get_state(),
                "feedback": {k: None if f is None else [f.alloc, f.load, f.perf] for k, f in self.feedback.items()},
                "planned": None if self.planned is None else self.planned.to_json()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`save` output. A state without ``planned`` (saved before a decision was
        taken) continues with a fresh decision at the next ``on_round``.

        Raises:
            KeyError, TypeError, ValueError: the state lacks what the round needs; callers that read it
                from a file name the file (``tasks.cilantro.allocator.load_state``).
        """
        names = [j.name for j in self.jobs]
        self.rule.set_state(state["policy"])
        if self.learners:
            self.learners = {n: learner_from_state(state["learners"][n]) for n in names}
        self.loads.set_state(state["forecasters"])
        self.rng.bit_generator.state = state["rng"]
        self.next_round = int(state["next_round"])
        self.previous = None if state["previous"] is None else {k: float(v) for k, v in state["previous"].items()}
        self.seen = {n: int(state["seen"][n]) for n in names}
        self.feedback = {n: None if state["feedback"][n] is None else Feedback(*state["feedback"][n]) for n in names}
        planned = state.get("planned")
        self.planned = None if planned is None else RoundDecision.from_json(planned)
