"""Scenario parsing for the Cilantro simulator and the static Fig. 3.4 example (docs/cilantro.md).

``multitenant`` scenarios become a frozen :class:`MultiTenantConfig`; ``static`` scenarios (jobs
with utility ``min(1, a/d_j)``, thesis Fig. 3.4) are evaluated on exact curves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import (MAX_FACTOR, MAX_RATE, MAX_SECONDS, MAX_SEED, MAX_SEEDS, choose, integer, known_fields,
                          mapping, policy_names, positive, require)
from gpu.schedulers.cilantro.policies import make_policy
from gpu.schedulers.cilantro.metrics import (UTILITY_EXPONENTS, egalitarian_welfare, njc_fairness,
                                             njc_fairness_resource, social_welfare, useful_usage)
from gpu.schedulers.cilantro.types import JobSpec, JobView, Snapshot
from gpu.sim.cilantro.workloads import PROFILES, SYNTHETIC, Profile, load_series, paper_jobs, profile


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
    learner_beta: float | None = None  # None: the learner's own default
    lipschitz: float | None = None
    forecaster: str = "arima"
    arima_d: int = 1
    forecast_window: int = 4000
    forecast_confidence: float = 0.9
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


MAX_UNITS = 10_000  # allocation grid points (capacity / unit): the exact welfare DP is quadratic in them
MAX_REPORTS = 1_000_000  # reports per job over the run: the load traces are held in memory
MULTITENANT_KEYS = ("kind", "capacity", "unit", "round_s", "report_s", "horizon_s", "max_change", "seeds", "seed",
                    "roster", "jobs", "learner", "forecaster", "warmup_reports", "ml_noise", "policies")
JOB_KEYS = ("name", "workload", "slo", "utility", "weight")
WORKLOADS = [*PROFILES, *SYNTHETIC]




def seed_list(value: Any, field: str = "seeds") -> tuple[int, ...]:
    """A non-empty list of at most MAX_SEEDS whole numbers from 0 to MAX_SEED (numpy's seed sequences refuse
    negatives; each seed is a whole run)."""
    if not isinstance(value, list) or not value or len(value) > MAX_SEEDS:
        raise ConfigError(field, value, f"must be a non-empty list of at most {MAX_SEEDS} integers")
    return tuple(integer(s, f"{field}[{i}]", minimum=0, maximum=MAX_SEED) for i, s in enumerate(value))




def _job(raw: Any, i: int) -> SimJob:
    where = f"jobs[{i}]"
    raw = mapping(raw, where, optional=False)
    known_fields(raw, JOB_KEYS, f"{where}.")
    name = require(raw, "name", f"{where}.")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name", name, "must be a non-empty string")
    workload = choose(require(raw, "workload", f"{where}."), f"{where}.workload", WORKLOADS)
    spec = JobSpec(name, positive(require(raw, "slo", f"{where}."), f"{where}.slo", upper=MAX_RATE),
                   choose(raw.get("utility", "linear"), f"{where}.utility", sorted(UTILITY_EXPONENTS)),
                   positive(raw.get("weight", 1.0), f"{where}.weight", upper=MAX_FACTOR), workload)
    return SimJob(spec, profile(workload))


def _jobs(raw: Mapping[str, Any]) -> tuple[SimJob, ...]:
    """``roster: paper`` or a ``jobs`` list (not both); job names are unique (allocations are keyed by them)."""
    if "roster" in raw:
        if raw["roster"] != "paper":
            raise ConfigError("roster", raw["roster"], "unknown; the only roster is 'paper' (or list 'jobs')")
        if "jobs" in raw:
            raise ConfigError("jobs", raw["jobs"], "give roster or jobs, not both")
        return tuple(SimJob(s, profile(s.workload)) for s in paper_jobs())
    entries = require(raw, "jobs")
    if not isinstance(entries, list) or not entries:
        raise ConfigError("jobs", entries, "must be a non-empty list")
    jobs = tuple(_job(e, i) for i, e in enumerate(entries))
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        if job.spec.name in seen:
            raise ConfigError(f"jobs[{i}].name", job.spec.name, "job names must be unique")
        seen.add(job.spec.name)
    return jobs


def _grid(raw: Mapping[str, Any]) -> tuple[float, float]:
    """``capacity`` and ``unit``: at least one and at most MAX_UNITS allocation units."""
    capacity = positive(raw.get("capacity", 1000.0), "capacity", upper=MAX_UNITS)
    unit = positive(raw.get("unit", 1.0), "unit")
    if unit > capacity:
        raise ConfigError("unit", unit, f"must not exceed capacity={capacity:g} (every allocation would be 0)")
    if capacity / unit > MAX_UNITS:
        raise ConfigError("capacity", capacity, f"capacity / unit = {capacity / unit:,.0f} allocation units; "
                                                f"at most {MAX_UNITS:,} (raise unit or lower capacity)")
    return capacity, unit


def _timing(raw: Mapping[str, Any]) -> tuple[float, float, float]:
    """``round_s``, ``report_s``, ``horizon_s``: at least one round, at most MAX_REPORTS reports per job."""
    round_s = positive(raw.get("round_s", 120.0), "round_s", upper=MAX_SECONDS)
    report_s = positive(raw.get("report_s", 10.0), "report_s", upper=MAX_SECONDS)
    horizon_s = positive(raw.get("horizon_s", 6 * 3600.0), "horizon_s", upper=MAX_SECONDS)
    if report_s > round_s:
        raise ConfigError("report_s", report_s, "must not exceed round_s")
    if horizon_s < round_s:
        raise ConfigError("horizon_s", horizon_s, f"shorter than one round (round_s={round_s:g})")
    per_round = max(1, round(round_s / report_s))
    if per_round > MAX_REPORTS:
        raise ConfigError("report_s", report_s, f"{per_round:,} reports per round; at most {MAX_REPORTS:,}")
    if horizon_s // round_s * per_round > MAX_REPORTS:
        raise ConfigError("horizon_s", horizon_s, f"{horizon_s // round_s * per_round:,.0f} reports per job; "
                                                  f"at most {MAX_REPORTS:,} (shorten horizon_s or raise report_s)")
    return round_s, report_s, horizon_s


def parse_multitenant(raw: Mapping[str, Any]) -> MultiTenantConfig:
    """Validate a ``multitenant`` scenario mapping; every bad field raises ConfigError naming it."""
    known_fields(raw, MULTITENANT_KEYS)
    jobs = _jobs(raw)
    learner = mapping(raw.get("learner"), "learner")
    known_fields(learner, ("kind", "beta", "lipschitz"), "learner.")
    fc = mapping(raw.get("forecaster"), "forecaster")
    known_fields(fc, ("kind", "d", "window", "confidence"), "forecaster.")
    confidence = positive(fc.get("confidence", 0.9), "forecaster.confidence")
    if confidence >= 1:
        raise ConfigError("forecaster.confidence", confidence, "must be in (0, 1)")
    mc = raw.get("max_change", 10.0)
    seeds = seed_list(raw["seeds"]) if "seeds" in raw else (integer(raw.get("seed", 0), "seed", minimum=0,
                                                                     maximum=MAX_SEED),)
    capacity, unit = _grid(raw)
    round_s, report_s, horizon_s = _timing(raw)
    return MultiTenantConfig(
        jobs=jobs, capacity=capacity, unit=unit, round_s=round_s, report_s=report_s, horizon_s=horizon_s,
        max_change=None if mc is None else positive(mc, "max_change", allow_zero=True, upper=MAX_UNITS),
        seeds=seeds,
        learner=choose(learner.get("kind", "ibtree"), "learner.kind", ["ibtree", "saturating"]),
        learner_beta=None if learner.get("beta") is None else positive(learner["beta"], "learner.beta",
                                                                        upper=MAX_FACTOR),
        lipschitz=None if learner.get("lipschitz") is None else positive(learner["lipschitz"], "learner.lipschitz",
                                                                         upper=MAX_FACTOR),
        forecaster=choose(fc.get("kind", "arima"), "forecaster.kind", ["arima", "ewma"]),
        arima_d=choose(integer(fc.get("d", 1), "forecaster.d"), "forecaster.d", [0, 1]),
        forecast_window=integer(fc.get("window", 4000), "forecaster.window", minimum=8, maximum=MAX_REPORTS),
        forecast_confidence=confidence,
        warmup_reports=integer(raw.get("warmup_reports", 5), "warmup_reports", minimum=0, maximum=MAX_REPORTS),
        ml_noise=positive(raw.get("ml_noise", 0.05), "ml_noise", allow_zero=True, upper=1.0),
    )


DEFAULT_STATIC_POLICIES = ("resource-fair", "oracle-njc", "oracle-sw", "oracle-ew", "cilantro-pf")
"""What a ``kind: static`` scenario (Fig. 3.4) runs when it names no ``policies``: a subset of ``POLICIES``."""


def static_example(capacity: float, demands: list[float], policies: list[str] | None = None) -> list[dict[str, Any]]:
    """Fig. 3.4: jobs with ``u_j(a) = min(1, a/d_j)`` on exact curves; one row per policy."""
    grid = np.arange(int(capacity) + 1, dtype=float)
    d = np.asarray(demands, dtype=float)
    jobs = tuple(JobView(JobSpec(f"job{i + 1}", 1.0), grid, np.minimum(1, grid / di), np.minimum(1, grid / di),
                         demand_cap=di) for i, di in enumerate(d))
    snap = Snapshot(capacity, jobs, previous=None, max_change=None, round_index=1)
    fair_u = np.minimum(1, capacity / len(d) / d)
    rows = []
    for name in policies or DEFAULT_STATIC_POLICIES:
        a = np.array(list(make_policy(name).decide(snap, np.random.default_rng(0)).values()))
        u = np.minimum(1, a / d)
        rows.append({"policy": name, "allocation": "/".join(f"{v:g}" for v in a), "social_welfare": social_welfare(u),
                     "egalitarian_welfare": egalitarian_welfare(u), "njc_fairness": njc_fairness(u, fair_u),
                     "useful_usage": useful_usage(a, d, capacity),
                     "njc_fairness_resource": njc_fairness_resource(a, d, capacity)})
    return rows


def run_static(raw: Mapping[str, Any], policies: list[str] | None) -> SimulationReport:
    """``kind: static``: whole CPUs (``capacity`` <= MAX_UNITS) shared by jobs of the given ``demands``."""
    known_fields(raw, ("kind", "capacity", "demands", "policies"))
    capacity = integer(require(raw, "capacity"), "capacity", minimum=1)
    if capacity > MAX_UNITS:
        raise ConfigError("capacity", capacity, f"at most {MAX_UNITS:,} CPUs")
    demands = require(raw, "demands")
    if not isinstance(demands, list) or not demands:
        raise ConfigError("demands", demands, "must be a non-empty list")
    rows = static_example(capacity, [positive(v, f"demands[{i}]", upper=MAX_UNITS) for i, v in enumerate(demands)],
                          policy_names(raw, policies, DEFAULT_STATIC_POLICIES))
    summary = {f"{r['policy'].replace('-', '_')}_{m}": r[m] for r in rows
               for m in ("social_welfare", "egalitarian_welfare", "njc_fairness", "useful_usage")}
    return SimulationReport("cilantro", rows, summary)
