"""``gpuflows simulate salus SCENARIO``: one device's job trace under FIFO, SRTF, PACK and FAIR (thesis §2.5.1).

Every policy runs in the same engine (``gpu.sim.salus.engine``) with the same ``SalusController`` the torch
executor uses; only the controller's policy differs (the thesis does not say whether Table 2.1's FIFO ran
inside Salus; running all four in one engine makes their makespans comparable). Scenario format:
``docs/salus.md``. On a simulated pool lanes are memory *accounting*: nothing is allocated.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import (MAX_COUNT, MAX_EVENTS, MAX_FACTOR, MAX_MB, MAX_SECONDS, MAX_SEED, choose, entries, flag,
                          integer, known_fields, label, load_scenario, policy_names, positive, require, section,
                          within_events)
from gpu.schedulers.salus.controller import SalusController, SalusJob
from gpu.schedulers.salus.lanes import Margins
from gpu.schedulers.salus.policies import ADMISSIONS, POLICIES
from gpu.sim.salus.engine import SimResult, simulate
from gpu.sim.salus.workloads import TraceJob, tiresias_like_trace, trace_job

DEFAULT_POLICIES = ("fifo", "srtf", "pack", "fair")
SCENARIO_KEYS = ("name", "device_mb", "seed", "policies", "quantum_s", "margins", "admission", "trace", "jobs")
TRACE_KEYS = ("jobs", "mean_gap_s", "median_s", "sigma")
JOB_KEYS = ("id", "arrival_s", "iterations", "workload", "persistent_mb", "ephemeral_mb", "iter_s", "u",
            "expected_s", "weight")
NOTE = ("lanes are memory accounting on a simulated device (nothing is allocated); lanes share compute at "
        "min(1, 1/sum u) of solo speed (our contention model, Salus schedules memory only, thesis §5.1)")


def _job(row: dict[str, Any], where: str) -> TraceJob:
    """An explicit job: a Table A.1 ``workload`` name, or its own sizes (``persistent_mb``, ``ephemeral_mb``,
    ``iter_s``, ``u``); ``expected_s`` defaults to ``iterations x iter_s``."""
    job_id = label(require(row, "id", f"{where}."), f"{where}.id")
    arrival = positive(row.get("arrival_s", 0.0), f"{where}.arrival_s", allow_zero=True, upper=MAX_SECONDS)
    iterations = integer(require(row, "iterations", f"{where}."), f"{where}.iterations", minimum=1,
                         maximum=MAX_EVENTS)
    if "workload" in row:
        for key in ("persistent_mb", "ephemeral_mb", "iter_s", "u"):
            if key in row:
                raise ConfigError(f"{where}.{key}", row[key], "give a workload name or explicit sizes, not both")
        base = trace_job(job_id, arrival, label(row["workload"], f"{where}.workload"), iterations)
        p, e, iter_s, u = base.salus.persistent_mb, base.salus.ephemeral_mb, base.iter_s, base.u
    else:
        p = positive(require(row, "persistent_mb", f"{where}."), f"{where}.persistent_mb", upper=MAX_MB)
        e = positive(require(row, "ephemeral_mb", f"{where}."), f"{where}.ephemeral_mb", upper=MAX_MB)
        iter_s = positive(require(row, "iter_s", f"{where}."), f"{where}.iter_s", upper=MAX_SECONDS)
        u = positive(row.get("u", 1.0), f"{where}.u")
        if u > 1:
            raise ConfigError(f"{where}.u", u, "compute intensity must be in (0, 1]")
    expected = (positive(row["expected_s"], f"{where}.expected_s", upper=MAX_SECONDS) if "expected_s" in row
                else iterations * iter_s)
    weight = positive(row.get("weight", 1.0), f"{where}.weight", upper=MAX_FACTOR)
    return TraceJob(SalusJob(job_id, p, e, expected_s=expected, weight=weight, iterations=iterations), arrival, iter_s,
                    iterations, u)


def parse_jobs(data: Mapping[str, Any], seed: int) -> list[TraceJob]:
    """The scenario's ``jobs`` list or its synthetic ``trace`` (exactly one of them)."""
    if ("jobs" in data) == ("trace" in data):
        raise ConfigError("jobs", data.get("jobs"), "give either jobs (a list) or trace (a synthetic trace)")
    if "trace" in data:
        t = section(data["trace"], "trace", TRACE_KEYS, optional=False)
        return tiresias_like_trace(integer(t.get("jobs", 100), "trace.jobs", minimum=1, maximum=MAX_COUNT), seed,
                                   positive(t.get("mean_gap_s", 15.0), "trace.mean_gap_s", upper=MAX_SECONDS),
                                   positive(t.get("median_s", 100.0), "trace.median_s", upper=MAX_SECONDS),
                                   positive(t.get("sigma", 1.2), "trace.sigma", allow_zero=True, upper=10.0))
    rows = entries(data["jobs"], "jobs", JOB_KEYS)
    if not rows:
        raise ConfigError("jobs", data["jobs"], "must list at least one job")
    jobs = [_job(row, f"jobs[{i}]") for i, row in enumerate(rows)]
    ids = [j.salus.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ConfigError("jobs", ids, "job ids must be unique")
    return jobs


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """Simulate the scenario under each policy (default: the scenario's, else FIFO/SRTF/PACK/FAIR)."""
    data = load_scenario(scenario_path)
    known_fields(data, SCENARIO_KEYS, "")
    device_mb = positive(data.get("device_mb", 16_000), "device_mb", upper=MAX_MB)
    seed = integer(data.get("seed", 0), "seed", minimum=0, maximum=MAX_SEED)
    name = label(data.get("name", scenario_path), "name")
    chosen = policy_names(data, policies, DEFAULT_POLICIES)
    for p in chosen:
        choose(p, "policy", list(POLICIES))
    admission = data.get("admission")
    if admission is not None:
        choose(admission, "admission", list(ADMISSIONS))
    m = section(data.get("margins"), "margins", ("persistent", "total", "reserve_mb", "exact"))
    margins = Margins(1.0, 1.0, 0.0) if flag(m.pop("exact", False), "margins.exact") else Margins(**m)
    quantum = positive(data.get("quantum_s", 0.0), "quantum_s", allow_zero=True, upper=MAX_SECONDS)
    jobs = parse_jobs(data, seed)
    steps = sum(j.iterations if not quantum else min(j.iterations, math.ceil(j.iterations * j.iter_s / quantum))
                for j in jobs)  # a step is an iteration, or quantum_s of them
    within_events(steps * len(chosen), "jobs", len(jobs), "iteration steps (the jobs' iterations, grouped by "
                                                          "quantum_s, x policies)")
    controllers = {p: SalusController(device_mb, p, margins, admission) for p in chosen}  # all checked first
    for job in jobs:
        controllers[chosen[0]].lanes.charge(job.salus.job_id, job.salus.persistent_mb, job.salus.ephemeral_mb)
    results = {p: simulate(jobs, ctl, quantum) for p, ctl in controllers.items()}
    return report(name, results)


def report(name: str, results: dict[str, SimResult]) -> SimulationReport:
    """A row per policy; summary ``<policy>_<metric>`` plus SRTF's JCT speed-up and PACK's makespan ratio."""
    table, summary = [], {}
    for policy, result in results.items():
        row = result.summary()
        table.append({"policy": policy, **row})
        summary.update({f"{policy}_{k}": v for k, v in row.items()})
    if "fifo" in results:
        fifo = results["fifo"].summary()
        if "srtf" in results:
            summary["srtf_jct_speedup_vs_fifo"] = fifo["avg_jct_s"] / results["srtf"].summary()["avg_jct_s"]
        for p in ("pack", "fair", "srtf"):
            if p in results:
                summary[f"{p}_makespan_vs_fifo"] = results[p].makespan_s / fifo["makespan_s"]
    return SimulationReport("salus", table, summary, {"scenario": [{"name": name, "note": NOTE}]})


__all__ = ["run", "report", "parse_jobs", "DEFAULT_POLICIES"]
