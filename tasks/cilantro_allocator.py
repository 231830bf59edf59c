"""The learning half of a Cilantro allocation round, for ``flows.allocation_rounds`` (thesis ch. 3, §3.3 Fig. 3.3).

:class:`Allocator` owns one run's learners (``IntervalBinaryTree`` per job, on ``x = a/ℓ``), load
forecasters (``ArimaForecaster`` per service), the policy and its RNG: ``decide(r)`` builds the
frozen ``Snapshot`` from them and calls ``policy.decide``; ``observe(results)`` feeds the jobs'
reports back. ``to_state()``/``Allocator(settings, state)`` round-trip everything through plain
JSON, which :func:`save_state` writes atomically to ``state_dir()/cilantro/<run_name>.json`` after
each completed round; :func:`run_lock` keeps two flow runs off one run's state. The state also carries
``unlogged``: the MLflow records of rounds saved but not yet known to be logged, so a crash between the
save and the logging neither loses nor (logging is idempotent) duplicates a round.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.cilantro import make_policy
from gpu.schedulers.cilantro.forecasters import ArimaForecaster
from gpu.schedulers.cilantro.learners import IntervalBinaryTree, learner_from_state
from gpu.schedulers.cilantro.metrics import egalitarian_welfare, njc_fairness, social_welfare
from gpu.schedulers.cilantro.types import Feedback, JobSpec, JobView, Snapshot
from gpu.state import state_dir
from tasks.cilantro_jobs import JobConfig, expected_perf

STATE_VERSION = 1

@dataclass(frozen=True)
class RoundSettings:
    """Everything the rounds depend on (validated by :func:`settings_from`)."""

    run_name: str
    policy: str
    rounds: int
    round_s: float
    report_s: float
    capacity: float
    unit: float
    max_change: float | None
    trace_step: int
    interference: float
    warmup_reports: int
    seed: int
    resume: bool
    jobs: tuple[JobConfig, ...]
    tracking_uri: str | None = None
    experiment: str = "gpuflows"

    @property
    def reports(self) -> int:
        return max(1, int(round(self.round_s / self.report_s)))

    @property
    def grid(self) -> np.ndarray:
        return np.arange(int(math.floor(self.capacity / self.unit + 1e-9)) + 1) * self.unit

    def fingerprint(self) -> dict[str, Any]:
        """What a resumed run must share with the saved one."""
        return {"policy": self.policy, "capacity": self.capacity, "unit": self.unit,
                "jobs": [[j.name, j.kind] for j in self.jobs]}


def state_path(run_name: str) -> Path:
    return state_dir() / "cilantro" / f"{run_name}.json"


def load_state(run_name: str) -> dict | None:
    path = state_path(run_name)
    return json.loads(path.read_text()) if path.is_file() else None


def save_state(run_name: str, state: dict) -> Path:
    """Write the state atomically (a crash mid-write leaves the previous round's file intact)."""
    path = state_path(run_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
    return path


@contextmanager
def run_lock(run_name: str) -> Iterator[None]:
    """Hold ``<run_name>.lock`` while rounds run, so two flow runs never interleave one run's state
    (an ``flock``: the kernel drops it when the process dies, so a killed run leaves no stale lock)."""
    path = state_path(run_name).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError("run_name", run_name, "another flow run is executing rounds of this run now") from None
        yield


class Allocator:
    """Learners, load forecasters, the policy and its RNG for one run; round-trips through JSON."""

    def __init__(self, s: RoundSettings, state: dict | None = None):
        self.s = s
        self.policy = make_policy(s.policy)
        self.specs = {j.name: JobSpec(j.name, j.slo, j.utility, j.weight, j.kind) for j in s.jobs}
        self.learners = {j.name: IntervalBinaryTree(j.learner_upper if j.kind == "service" else s.capacity, j.lipschitz,
                                                    bounds=(0.0, 1.0) if j.kind == "service" else (0.0, math.inf))
                         for j in s.jobs}
        self.forecasters = {j.name: ArimaForecaster() for j in s.jobs if j.kind == "service"}
        self.rng = np.random.default_rng([s.seed, 7])
        self.next_round, self.previous, self.seen = 0, None, {j.name: 0 for j in s.jobs}
        self.feedback: dict[str, Feedback | None] = {j.name: None for j in s.jobs}
        self.checkpoints: dict[str, str | None] = {j.name: None for j in s.jobs}
        self.history: list[dict] = []
        self.unlogged: list[dict] = []
        if state is not None:
            self._restore(state)

    def _restore(self, state: dict) -> None:
        for key, value in self.s.fingerprint().items():
            if state["fingerprint"][key] != value:
                raise ConfigError(key, value, f"run {self.s.run_name!r} was saved with {key}={state['fingerprint'][key]!r}; "
                                              "use another run_name or resume=False")
        self.policy.set_state(state["policy"])
        self.learners = {k: learner_from_state(v) for k, v in state["learners"].items()}
        for name, fc in self.forecasters.items():
            fc.set_state(state["forecasters"][name])
        self.rng.bit_generator.state = state["rng"]
        self.next_round, self.previous, self.seen = state["next_round"], state["previous"], state["seen"]
        self.feedback = {k: None if v is None else Feedback(*v) for k, v in state["feedback"].items()}
        self.checkpoints, self.history = state["checkpoints"], state["history"]
        self.unlogged = state.get("unlogged", [])

    def to_state(self) -> dict:
        return {"version": STATE_VERSION, "run_name": self.s.run_name, "fingerprint": self.s.fingerprint(),
                "next_round": self.next_round, "previous": self.previous, "seen": self.seen,
                "policy": self.policy.get_state(), "rng": self.rng.bit_generator.state,
                "learners": {k: v.get_state() for k, v in self.learners.items()},
                "forecasters": {k: v.get_state() for k, v in self.forecasters.items()},
                "feedback": {k: None if f is None else [f.alloc, f.load, f.perf] for k, f in self.feedback.items()},
                "checkpoints": self.checkpoints, "history": self.history[-100:], "unlogged": self.unlogged}

    def load_ucb(self, job: JobConfig) -> float:
        """Upper 90 % bound of the job's load over the next round (round 0: the nominal load)."""
        if job.kind == "training":
            return 1.0
        fc = self.forecasters[job.name]
        return fc.forecast(self.s.reports)[2] if fc.history else job.base_load

    def decide(self, r: int) -> tuple[dict[str, float], dict[str, float]]:
        """This round's allocation ``{job: GPUs}`` and the load UCBs it was decided for."""
        grid, views, ucbs = self.s.grid, [], {}
        for j in self.s.jobs:
            ucb = ucbs[j.name] = max(self.load_ucb(j), 1e-6)
            spec, fb, lr = self.specs[j.name], self.feedback[j.name], self.learners[j.name]
            cap = lr.upper * ucb
            if self.policy.learner == "online":
                lcb, hi = lr.bounds(grid, ucb)
                views.append(JobView(spec, grid, lcb, hi, ucb, fb, demand_cap=cap))
            elif self.policy.learner == "oracle":
                truth = expected_perf(j, grid, ucb, self.s.report_s, self.s.seed)
                views.append(JobView(spec, grid, truth, truth, ucb, fb, demand_cap=cap))
            else:
                g = np.array([0.0, self.s.capacity])
                views.append(JobView(spec, g, np.full(2, lr.lo), np.full(2, lr.hi), ucb, fb, demand_cap=cap))
        snap = Snapshot(self.s.capacity, tuple(views), self.s.unit, self.previous, self.s.max_change, r)
        alloc = self.policy.decide(snap, self.rng)
        return {k: round(float(v), 9) for k, v in alloc.items()}, ucbs

    def observe(self, results: dict[str, dict | None]) -> None:
        """Feed each job's reports to its learner (after the warm-up) and its loads to its forecaster."""
        for name, res in results.items():
            if res is None:
                continue
            for load, perf, sigma in zip(res["loads"], res["perf"], res["sigma"]):
                self.seen[name] += 1
                if self.seen[name] > self.s.warmup_reports:
                    self.learners[name].update(res["alloc"], load, perf, sigma)
                if name in self.forecasters:
                    self.forecasters[name].update(load)
            self.feedback[name] = Feedback(res["alloc"], float(np.mean(res["loads"])), float(np.mean(res["perf"])))


def round_metrics(s: RoundSettings, specs: dict[str, JobSpec], results: dict[str, dict | None]) -> dict[str, Any]:
    """Per-job utilities and W_S, W_E, F_NJC of one round, per report then averaged (as ``gpu.sim.cilantro``).

    Jobs without an SLO have no utility and are left out; a failed job scores 0 against a fair share of 1.
    """
    k = s.reports
    util, fair, names = [], [], []
    for name, spec in specs.items():
        if spec.slo is None:
            continue
        res = results.get(name)
        names.append(name)
        util.append(spec.utility_of(np.asarray(res["perf"])) if res else np.zeros(k))
        fair.append(spec.utility_of(np.asarray(res["fair_perf"])) if res else np.ones(k))
    if not names:
        return {"utilities": {}}
    u, f = np.vstack(util), np.vstack(fair)
    return {"utilities": {n: float(v) for n, v in zip(names, u.mean(axis=1))},
            "social_welfare": social_welfare(u.mean(axis=1)),
            "egalitarian_welfare": float(np.mean([egalitarian_welfare(u[:, t]) for t in range(k)])),
            "njc_fairness": float(np.mean([njc_fairness(u[:, t], f[:, t]) for t in range(k)]))}
