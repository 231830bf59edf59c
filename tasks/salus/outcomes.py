"""What a Salus policy did to a trace of real torch jobs, measured, beside what the simulator predicts.

Every job reports the wall-clock span of each of its Salus iterations (taken inside the iteration, after its
lane's token was granted and before it is handed back), its lane and when it was admitted. From those spans
alone come the thesis's Table 2.1 metrics (makespan, queuing, average and p95 JCT, §2.5.1) and the switch
latency: the gap between one job's iteration ending and the next job's iteration starting on the same lane,
i.e. the token hand-off at an iteration boundary, where no state moves (§2.3.2). The same spans check the
one-iteration-at-a-time rule of a lane (``lane_overlaps`` must stay empty).

``predicted`` runs ``gpu.sim.salus`` on the same jobs (the memory they were admitted with, declared or
profiled, and the same arrivals and iterations) with each job's iteration time as measured, so the measured and
simulated numbers differ only by what the simulator's contention model leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from gpu.schedulers.salus.controller import SalusController, SalusJob
from gpu.schedulers.salus.lanes import Margins
from gpu.sim.salus.engine import simulate
from gpu.sim.salus.workloads import TraceJob
from tasks.salus.trace import SharingJob

METRICS = ("makespan_s", "avg_queuing_s", "avg_jct_s", "p95_jct_s")


@dataclass
class PolicyOutcome:
    """One policy's run of the trace: a row per job (times in seconds since the first arrival)."""

    policy: str
    jobs: list[dict[str, Any]]
    device_mb: float
    simulated_device: bool
    sizes: dict[str, tuple[float, float]]  # job -> (P, E) MB Algorithm 2.1 admitted it with, declared or profiled
    margins: Margins = Margins()  # the executor's safety margins
    summary: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.summary:
            self.summary = summarise(self.jobs)


def job_rows(trace: Sequence[SharingJob], results: Sequence[dict[str, Any]], arrivals: Sequence[float],
             t0: float, sizes: dict[str, tuple[float, float]], grants: dict[str, list[int]],
             queued: set[str] = frozenset()) -> list[dict[str, Any]]:
    """One row per job from its task's result, the wall time it was submitted at (its arrival), the memory it
    was admitted with, whether it was queued for memory (``queued``: trace ids) and the lanes the executor's token
    log granted it, one per iteration (a profiled job moves from its profiling lane to the lane it is re-admitted
    into; ``span_lanes`` follows it)."""
    rows = []
    for job, result, arrived in zip(trace, results, arrivals):
        spans = [(s - t0, e - t0) for s, e in result["spans"]]
        start, end = spans[0][0], spans[-1][1]
        lanes = grants.get(job.job_id) or [result["lane"]]
        span_lanes = lanes if len(lanes) == len(spans) else [lanes[-1]] * len(spans)
        rows.append({"job": job.job_id, "kind": job.kind, "workload": job.workload, "lane": lanes[-1],
                     "arrival_s": arrived - t0, "admitted_s": result["admitted"] - t0, "start_s": start,
                     "end_s": end, "queuing_s": start - (arrived - t0), "jct_s": end - (arrived - t0),
                     "setup_s": start - (result["admitted"] - t0),
                     "iterations": len(spans), "mean_iteration_ms": 1e3 * float(np.mean([e - s for s, e in spans])),
                     "persistent_mb": sizes[job.job_id][0], "ephemeral_mb": sizes[job.job_id][1],
                     "token_grants": len(grants.get(job.job_id, ())), "queued": job.job_id in queued,
                     "spans": spans, "span_lanes": span_lanes,
                     **{k: result[k] for k in ("accuracy", "served") if k in result}})
    return rows


def executor_record(executor: Any, declared: dict[str, tuple[float, float]], task_prefix: str
                    ) -> tuple[dict[str, tuple[float, float]], dict[str, list[int]], set[str]]:
    """What a policy's executor recorded, by trace job id: the memory each job was admitted with (``declared``
    (P, E) MB, or as the executor profiled it), the lanes its token log granted it, one per iteration, and the jobs
    it queued for memory. An executor's job id is its task's name, ``<task_prefix><job id>-<workload>``, and a
    suffix."""
    def trace_id(executor_id: str) -> str:
        return executor_id.removeprefix(task_prefix).split("-")[0]

    sizes = dict(declared)
    for executor_id, measured in executor.profiles.items():
        sizes[trace_id(executor_id)] = measured
    grants: dict[str, list[int]] = {}
    for _, lane, executor_id in executor.switches:
        grants.setdefault(trace_id(executor_id), []).append(lane)
    return sizes, grants, {trace_id(j) for j in executor.queued}


def _by_lane(rows: Sequence[dict[str, Any]]) -> dict[int, list[tuple[float, float, str]]]:
    lanes: dict[int, list[tuple[float, float, str]]] = {}
    for r in rows:
        for (s, e), lane in zip(r["spans"], r.get("span_lanes") or [r["lane"]] * len(r["spans"])):
            lanes.setdefault(lane, []).append((s, e, r["job"]))
    return {lane: sorted(spans) for lane, spans in lanes.items()}


def switch_gaps(rows: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds from one job's iteration end to another job's next iteration start in the same lane."""
    return [s2 - e1 for spans in _by_lane(rows).values()
            for (_, e1, j1), (s2, _, j2) in zip(spans, spans[1:]) if j1 != j2]


def lane_overlaps(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of jobs whose iterations overlapped in one lane (a lane runs one iteration at a time: none)."""
    return [(j1, j2) for spans in _by_lane(rows).values()
            for (_, e1, j1), (s2, _, j2) in zip(spans, spans[1:]) if s2 < e1]


def peak_lanes(rows: Sequence[dict[str, Any]]) -> int:
    """Most lanes holding an admitted job at once (a lane lives while one of its jobs is admitted and unfinished)."""
    return max(len({r["lane"] for r in rows if r["admitted_s"] <= t < r["end_s"]}) for t in
               (r["admitted_s"] for r in rows))


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Table 2.1's metrics plus the peak number of lanes, the jobs queued for memory (``queued_on_arrival``, as the
    simulator counts them), the switch latency (median and p95, ms) and the jobs' average setup (admission to first
    iteration: building the model and its data, in process mode also the worker process's start; queuing includes
    it, as a job's session setup counts in Salus's JCT)."""
    jct = np.array([r["jct_s"] for r in rows])
    out = {"makespan_s": max(r["end_s"] for r in rows) - min(r["arrival_s"] for r in rows),
           "avg_queuing_s": float(np.mean([r["queuing_s"] for r in rows])),
           "avg_jct_s": float(jct.mean()), "p95_jct_s": float(np.percentile(jct, 95)),
           "avg_setup_s": float(np.mean([r["setup_s"] for r in rows])),
           "peak_lanes": float(peak_lanes(rows)),
           "queued_on_arrival": float(sum(bool(r.get("queued")) for r in rows))}
    gaps = switch_gaps(rows)
    out["switches"] = float(len(gaps))
    if gaps:
        out |= {"switch_ms_median": 1e3 * float(np.median(gaps)), "switch_ms_p95": 1e3 * float(np.percentile(gaps, 95))}
    return out


def solo_iteration_s(outcomes: Sequence[PolicyOutcome]) -> dict[str, float]:
    """Each job's iteration time as measured: the lowest mean over the policies run (the least contended)."""
    best: dict[str, float] = {}
    for outcome in outcomes:
        for r in outcome.jobs:
            best[r["job"]] = min(best.get(r["job"], np.inf), r["mean_iteration_ms"] / 1e3)
    return best


def predicted(trace: Sequence[SharingJob], outcome: PolicyOutcome, iter_s: dict[str, float]) -> dict[str, float]:
    """The simulator's Table 2.1 metrics for the same jobs under the outcome's policy and margins, with the memory
    they were admitted with and their measured iteration times (its contention model: lanes progress at
    ``min(1, 1/sum u)`` of solo speed, with ``u`` from the jobs' workloads)."""
    jobs = [TraceJob(SalusJob(j.job_id, *outcome.sizes[j.job_id], expected_s=j.iterations * iter_s[j.job_id],
                              iterations=j.iterations), j.arrival_s, iter_s[j.job_id], j.iterations, j.u)
            for j in trace]
    summary = simulate(jobs, SalusController(outcome.device_mb, outcome.policy, outcome.margins)).summary()
    return {k: summary[k] for k in (*METRICS, "peak_lanes", "queued_on_arrival")}
