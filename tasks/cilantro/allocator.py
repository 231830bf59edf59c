"""The flow's side of Cilantro's allocation rounds, for ``flows.allocation_rounds`` (thesis ch. 3, §3.3 Fig. 3.3).

The round itself (learners, load forecasts, policy, RNG, the decision) is
:class:`gpu.schedulers.cilantro.controller.CilantroRound`, the same controller the simulator drives. Here:
the flow's settings (:class:`RoundSettings`), its jobs as the round knows them (:func:`round_jobs`: an
``IntervalBinaryTree`` per job on ``x = a/ℓ``, an ``ArimaForecaster`` per service), and :class:`RoundBook`,
which adds what only the flow keeps (trainer checkpoints, history, unlogged MLflow records) and round-trips
through plain JSON; :func:`save_state` writes it atomically to ``state_dir()/cilantro/<run_name>.json``
after each completed round and :func:`run_lock` keeps two flow runs off one run's state. ``unlogged`` holds
the MLflow records of rounds saved but not yet known to be logged, so a crash between the save and the
logging neither loses nor (logging is idempotent) duplicates a round.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.policies import make_policy
from gpu.schedulers.cilantro.forecasters import ArimaForecaster
from gpu.schedulers.cilantro.learners import IntervalBinaryTree
from gpu.schedulers.cilantro.metrics import egalitarian_welfare, njc_fairness, social_welfare
from gpu.schedulers.cilantro.controller import CilantroRound, JobReport, LoadForecasts, RoundJob
from gpu.schedulers.cilantro.types import JobSpec
from gpu.state import state_dir
from tasks.cilantro.jobs import JobConfig

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
    """The saved state of ``run_name`` (None if there is none); a file that is not JSON is a ConfigError naming it."""
    path = state_path(run_name)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError("state", str(path), f"is not a saved Cilantro state ({exc}); use another run_name") from None


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


def round_jobs(s: RoundSettings) -> tuple[RoundJob, ...]:
    """The flow's jobs as the round controller knows them: an interval tree per job on ``x = a/ℓ`` (services:
    up to ``learner_upper``; training, ℓ ≡ 1: up to R) and no true curve (the flow measures, it is not told)."""
    out = []
    for j in s.jobs:
        upper, bounds = (j.learner_upper, (0.0, 1.0)) if j.kind == "service" else (s.capacity, (0.0, math.inf))
        out.append(RoundJob(JobSpec(j.name, j.slo, j.utility, j.weight, j.kind), upper, bounds,
                            partial(IntervalBinaryTree, upper, j.lipschitz, bounds=bounds)))
    return tuple(out)


class RoundBook:
    """One flow run's rounds: the :class:`CilantroRound` controller plus what the flow keeps beside it
    (checkpoints, a short history, unlogged MLflow records); round-trips through one JSON file."""

    def __init__(self, s: RoundSettings, state: dict | None = None):
        self.s = s
        loads = LoadForecasts({j.name: ArimaForecaster() for j in s.jobs if j.kind == "service"},
                              {j.name: j.base_load for j in s.jobs}, s.reports)
        self.ctl = CilantroRound(round_jobs(s), make_policy(s.policy), capacity=s.capacity, unit=s.unit,
                                 max_change=s.max_change, loads=loads, seed=s.seed, warmup_reports=s.warmup_reports)
        self.specs = {j.spec.name: j.spec for j in self.ctl.jobs}
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
        self.ctl.restore(state)
        self.checkpoints, self.history = state["checkpoints"], state["history"]
        self.unlogged = state.get("unlogged", [])

    def to_state(self) -> dict:
        return {"version": STATE_VERSION, "run_name": self.s.run_name, "fingerprint": self.s.fingerprint(),
                **self.ctl.save(), "checkpoints": self.checkpoints, "history": self.history[-100:],
                "unlogged": self.unlogged}


def open_book(s: RoundSettings, saved: dict | None) -> RoundBook:
    """The run's book, resumed from ``saved`` when asked to; a state file this version cannot read is one
    ConfigError naming the file (never a KeyError deep in a learner)."""
    if not (s.resume and saved is not None):
        return RoundBook(s)
    try:
        return RoundBook(s, saved)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError("state", str(state_path(s.run_name)),
                          f"cannot be resumed ({type(exc).__name__}: {exc}); use another run_name or resume=False") from None


def report_of(result: dict | None) -> JobReport | None:
    """A job task's result as the feedback the round folds (None for a failed job)."""
    if result is None:
        return None
    return JobReport(float(result["alloc"]), tuple(result["loads"]), tuple(result["perf"]), tuple(result["sigma"]))


def round_metrics(s: RoundSettings, specs: dict[str, JobSpec], results: dict[str, dict | None]) -> dict[str, Any]:
    """Per-job utilities and W_S, W_E, F_NJC of one round, per report then averaged (as ``gpu.sim.cilantro.run``).

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
