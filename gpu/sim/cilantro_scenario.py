"""Scenario parsing for the Cilantro simulator and the static Fig. 3.4 example (docs/cilantro.md).

``multitenant`` scenarios become a frozen :class:`MultiTenantConfig`; ``static`` scenarios (jobs
with utility ``min(1, a/d_j)``, thesis Fig. 3.4 / spec §11 A3) are evaluated on exact curves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import choose, positive, require
from gpu.schedulers.cilantro import make_policy
from gpu.schedulers.cilantro.metrics import (egalitarian_welfare, njc_fairness, njc_fairness_resource, social_welfare,
                                             useful_usage)
from gpu.schedulers.cilantro.types import JobSpec, JobView, Snapshot
from gpu.sim.cilantro_workloads import Profile, load_series, paper_jobs, profile


@dataclass(frozen=True, eq=False)
class SimJob:
    spec: JobSpec
    profile: Profile


@dataclass(frozen=True, eq=False)
class MultiTenantConfig:
    """A multi-tenant run: pool, timing, jobs, learner/forecaster choices (defaults = the paper's)."""

    jobs: tuple[SimJob, ...]
    capacity: float = 1000.0
    unit: float = 1.0
    round_s: float = 120.0
    report_s: float = 10.0
    horizon_s: float = 6 * 3600.0
    max_change: float | None = 10.0
    seeds: tuple[int, ...] = (0,)
    learner: str = "ibtree"
    learner_beta: float = 2.0
    lipschitz: float | None = None
    forecaster: str = "arima"
    arima_d: int = 1
    forecast_window: int = 4000
    warmup_reports: int = 5
    ml_noise: float = 0.05

    @property
    def reports_per_round(self) -> int:
        return max(1, int(round(self.round_s / self.report_s)))

    @property
    def rounds(self) -> int:
        return max(1, int(self.horizon_s // self.round_s))

    def loads(self, seed: int) -> np.ndarray:
        """Loads per (job, report) over the whole run; each job starts at a seeded trace offset."""
        steps = self.rounds * self.reports_per_round
        offsets = np.random.default_rng([seed, 3]).integers(0, 2952, len(self.jobs))
        return np.vstack([load_series(j.profile, steps, int(o)) for j, o in zip(self.jobs, offsets)])


def _job(raw: Mapping[str, Any], i: int) -> SimJob:
    where = f"jobs[{i}]."
    name = require(raw, "name", where)
    workload = require(raw, "workload", where)
    slo = raw.get("slo")
    spec = JobSpec(str(name), None if slo is None else positive(slo, f"{name}.slo"), raw.get("utility", "linear"),
                   positive(raw.get("weight", 1.0), f"{name}.weight"), str(workload))
    return SimJob(spec, profile(str(workload)))


def parse_multitenant(raw: Mapping[str, Any]) -> MultiTenantConfig:
    """Validate a ``multitenant`` scenario mapping; every bad field raises ConfigError naming it."""
    if raw.get("roster") == "paper":
        jobs = tuple(SimJob(s, profile(s.workload)) for s in paper_jobs())
    elif "roster" in raw:
        raise ConfigError("roster", raw["roster"], "unknown; the only roster is 'paper' (or list 'jobs')")
    else:
        entries = require(raw, "jobs")
        if not isinstance(entries, list) or not entries:
            raise ConfigError("jobs", entries, "must be a non-empty list")
        jobs = tuple(_job(e, i) for i, e in enumerate(entries))
    learner = raw.get("learner", {}) or {}
    fc = raw.get("forecaster", {}) or {}
    mc = raw.get("max_change", 10.0)
    seeds = raw.get("seeds", [raw.get("seed", 0)])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError("seeds", seeds, "must be a non-empty list of integers")
    cfg = MultiTenantConfig(
        jobs=jobs,
        capacity=positive(raw.get("capacity", 1000.0), "capacity"),
        unit=positive(raw.get("unit", 1.0), "unit"),
        round_s=positive(raw.get("round_s", 120.0), "round_s"),
        report_s=positive(raw.get("report_s", 10.0), "report_s"),
        horizon_s=positive(raw.get("horizon_s", 6 * 3600.0), "horizon_s"),
        max_change=None if mc is None else positive(mc, "max_change", allow_zero=True),
        seeds=tuple(seeds),
        learner=choose(learner.get("kind", "ibtree"), "learner.kind", ["ibtree", "saturating"]),
        learner_beta=positive(learner.get("beta", 2.0), "learner.beta"),
        lipschitz=None if learner.get("lipschitz") is None else positive(learner["lipschitz"], "learner.lipschitz"),
        forecaster=choose(fc.get("kind", "arima"), "forecaster.kind", ["arima", "ewma"]),
        arima_d=choose(fc.get("d", 1), "forecaster.d", [0, 1]),
        forecast_window=int(positive(fc.get("window", 4000), "forecaster.window")),
        warmup_reports=int(positive(raw.get("warmup_reports", 5), "warmup_reports", allow_zero=True)),
        ml_noise=positive(raw.get("ml_noise", 0.05), "ml_noise", allow_zero=True),
    )
    if cfg.report_s > cfg.round_s:
        raise ConfigError("report_s", cfg.report_s, "must not exceed round_s")
    if any(j.spec.slo is None for j in cfg.jobs):
        missing = next(j.spec.name for j in cfg.jobs if j.spec.slo is None)
        raise ConfigError(f"{missing}.slo", None, "every job needs an SLO: utilities and welfare are defined by it")
    return cfg


STATIC_POLICIES = ["resource-fair", "oracle-njc", "oracle-sw", "oracle-ew", "cilantro-pf"]


def static_example(capacity: float, demands: list[float], policies: list[str] | None = None) -> list[dict[str, Any]]:
    """Fig. 3.4: jobs with ``u_j(a) = min(1, a/d_j)`` on exact curves; one row per policy."""
    grid = np.arange(int(capacity) + 1, dtype=float)
    d = np.asarray(demands, dtype=float)
    jobs = tuple(JobView(JobSpec(f"job{i + 1}", 1.0), grid, np.minimum(1, grid / di), np.minimum(1, grid / di),
                         demand_cap=di) for i, di in enumerate(d))
    snap = Snapshot(capacity, jobs, previous=None, max_change=None, round_index=1)
    fair_u = np.minimum(1, capacity / len(d) / d)
    rows = []
    for name in policies or STATIC_POLICIES:
        a = np.array(list(make_policy(name).decide(snap, np.random.default_rng(0)).values()))
        u = np.minimum(1, a / d)
        rows.append({"policy": name, "allocation": "/".join(f"{v:g}" for v in a), "social_welfare": social_welfare(u),
                     "egalitarian_welfare": egalitarian_welfare(u), "njc_fairness": njc_fairness(u, fair_u),
                     "useful_usage": useful_usage(a, d, capacity),
                     "njc_fairness_resource": njc_fairness_resource(a, d, capacity)})
    return rows


def run_static(raw: Mapping[str, Any], policies: list[str] | None) -> SimulationReport:
    capacity = positive(require(raw, "capacity"), "capacity")
    demands = require(raw, "demands")
    if not isinstance(demands, list) or not demands:
        raise ConfigError("demands", demands, "must be a non-empty list")
    rows = static_example(capacity, [positive(v, f"demands[{i}]") for i, v in enumerate(demands)],
                          policies or raw.get("policies"))
    summary = {f"{r['policy'].replace('-', '_')}_{m}": r[m] for r in rows
               for m in ("social_welfare", "egalitarian_welfare", "njc_fairness", "useful_usage")}
    return SimulationReport("cilantro", rows, summary)
