"""Check 4: the Salus executor on a device (thesis Ch. 2; the spec's G2-G4).

* Co-location and switching (G3, G4): two real torch trainers (``work.lane_job``, each declaring 512 MiB
  persistent and 2 GiB ephemeral memory) submitted to ``GpuTaskRunner(admission=SalusColocation(policy="fair"))``:
  FAIR admits both into one lane of the device's executor, they take turns at iteration boundaries, and each worker
  process is capped at its lane budget ``P + L_lane``. Measured: the switch cost (one job's iteration end to the
  other's next start, ``tasks.salus.outcomes.switch_gaps``), no two iterations of the lane at once, and the memory
  each job held at its iteration boundaries and at its peak against what it declared (G2: persistent << peak).
* Scheduling (G4): a three-job trace, one long trainer and two short ones arriving together, through the
  ``flows.gpu_sharing`` flow's own ``run_policy`` under FIFO and SRTF: SRTF's average JCT must be the lower
  (Table 2.1: FIFO 170.6 / SRTF 53.4 min = 3.19x on the 100-job trace; three jobs of our choosing set our ratio).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
from prefect import flow

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.report import Outcome, verdict
from benchmarks.gpu_check.work import LANE_EPHEMERAL, LANE_PERSISTENT, lane_job
from gpu.units import parse_memory
from tasks.salus.outcomes import lane_overlaps, switch_gaps

WORKLOAD = "inception3_50"  # the thesis's FAIR experiment's job (Fig. 2.9); a trainer of Table A.1
PAPER_RATIO = 170.6 / 53.4  # Table 2.1, average JCT FIFO / SRTF
MIB = 2**20


@flow(name="gpu-check-salus")
def salus_flow(pool: Any, quick: bool, workdir: str) -> dict[str, Any]:
    """The co-located pair on a runner with a Salus admission, then the trace under FIFO and under SRTF."""
    from flows.gpu_sharing import run_policy
    from tasks.runtime.rendezvous import Rendezvous
    from tasks.runtime.runners import GpuTaskRunner
    from tasks.salus.admission import SalusColocation
    from tasks.salus.trace import explicit_trace, warm_up

    iterations = 20 if quick else 60
    runner = GpuTaskRunner(pool=pool, admission=SalusColocation(policy="fair", devices=(0,), max_jobs_per_device=2),
                           tracking=False)
    meet = Rendezvous.create(workdir, "lane-jobs-", 2, timedelta(seconds=60))
    with runner:
        futures = [runner.submit(lane_job.with_options(name=f"lane-job{i}"),
                                 {"job": f"job{i}", "iterations": iterations, "rendezvous": meet, "rank": i, "seed": i})
                   for i in range(2)]
        pair = [f.result() for f in futures]
    long, short = (100, 20) if quick else (300, 60)
    trace = explicit_trace([{"kind": "train", "workload": WORKLOAD, "iterations": n, "arrival_s": 0.0}
                            for n in (long, short, short)])
    mode = "thread" if quick else "process"  # thread: no worker start-up in the JCTs of a short run
    if mode == "thread":
        warm_up()
    policies = {policy: run_policy(trace, policy, pool, mode, "declared").summary for policy in ("fifo", "srtf")}
    return {"pair": pair, "policies": policies, "mode": mode}


def check(settings: Settings) -> Outcome:
    from resource_blocks import GpuPool

    return judge(salus_flow(GpuPool(name="gpu-check-salus", device_backend="nvml"), settings.quick,
                            str(settings.workdir)))


def judge(seen: dict[str, Any]) -> Outcome:
    """Co-location, switching, memory within the declaration, and SRTF ahead of FIFO."""
    pair = seen["pair"]
    failures = []
    rows = [{"job": r["job"], "lane": r["lane"], "spans": r["spans"]} for r in pair]
    gaps = switch_gaps(rows)
    lanes = {r["lane"] for r in pair}
    if len(lanes) != 1 or -1 in lanes:
        failures.append(f"FAIR put the two jobs in lanes {sorted(lanes)}, not one")
    if len(gaps) < min(len(r["spans"]) for r in pair) // 2:
        failures.append(f"only {len(gaps)} switches between the two jobs: they did not take turns")
    overlaps = lane_overlaps(rows)
    if overlaps:
        failures.append(f"{len(overlaps)} iterations of the lane ran at once")
    declared_p = parse_memory(LANE_PERSISTENT, "persistent")
    declared = declared_p + parse_memory(LANE_EPHEMERAL, "ephemeral")
    held, peak = max(r["held_max"] for r in pair), max(r["peak"] for r in pair)
    cap = min(r["memory_cap"] for r in pair)
    if held > declared_p:
        failures.append(f"a job held {held / MIB:.0f} MiB between iterations, more than its {LANE_PERSISTENT}")
    if peak > min(cap, declared):
        failures.append(f"a job peaked at {peak / MIB:.0f} MiB, over its lane budget {cap / MIB:.0f} MiB")
    fifo, srtf = seen["policies"]["fifo"], seen["policies"]["srtf"]
    ratio = fifo["avg_jct_s"] / srtf["avg_jct_s"]
    if not ratio > 1:
        failures.append(f"SRTF's average JCT {srtf['avg_jct_s']:.2f} s is not below FIFO's {fifo['avg_jct_s']:.2f} s")
    switch_ms = 1e3 * float(np.median(gaps)) if gaps else float("nan")
    figure = (f"one lane, switch {switch_ms:.2f} ms median; held {held / MIB:.0f}/{declared_p / MIB:.0f} MiB P, "
              f"peak {peak / MIB:.0f}/{cap / MIB:.0f} MiB cap; avg JCT FIFO/SRTF {ratio:.2f}x (paper 3.19x)")
    figures = {"switches": len(gaps), "switch_ms_median": switch_ms,
               "switch_ms_p95": 1e3 * float(np.percentile(gaps, 95)) if gaps else float("nan"),
               "held_mb": held / MIB, "declared_persistent_mb": declared_p / MIB, "peak_mb": peak / MIB,
               "lane_cap_mb": cap / MIB, "fifo_avg_jct_s": fifo["avg_jct_s"], "srtf_avg_jct_s": srtf["avg_jct_s"],
               "fifo_makespan_s": fifo["makespan_s"], "srtf_makespan_s": srtf["makespan_s"],
               "jct_ratio_fifo_srtf": ratio, "paper_jct_ratio": PAPER_RATIO, "trace_mode": seen["mode"]}
    return verdict("salus", failures, figure, figures)
