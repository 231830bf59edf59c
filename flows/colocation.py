"""Salus co-location: a small trace of real torch training jobs sharing one pool device (thesis Ch. 2).

Jobs arrive ``gap_s`` apart; each trains a small MLP on scikit-learn's digits for its own number of Salus
iterations (a few optimizer steps each). The device's Salus executor admits them into memory lanes
(Algorithm 2.1) and its policy (fifo, pack, srtf, fair, weighted_fair) decides, at every iteration
boundary, which job of a lane runs next. The flow reports each job's queueing and completion time, the
policy's makespan, average and p95 JCT, and how long a switch between jobs at an iteration boundary takes
(MLflow metrics, table artifact ``salus-jobs-<policy>``).

    python -m flows.colocation --policy srtf --jobs 6
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from prefect import flow, task

from gpu.errors import ConfigError, GpuflowsError
from gpu.pool import pool_path
from gpu.scenario import choose, integer, positive
from gpu.schedulers.salus.policies import POLICIES
from gpuflows.args import error, simulated
from resource_blocks import GpuPool, MlflowTarget
from tasks.flow_runtime import log_flow_inputs, log_flow_outcome, publish_mlflow_link, settings
from tasks.requests import current_placement
from tasks.runners import GpuTaskRunner
from tasks.salus_executor import salus_iterations, salus_job, salus_options
from tasks.ui import publish_table

MODES = ("process", "thread")
DEFAULT_POOL = GpuPool(name="salus", simulated="1x16GiB")
STEPS_PER_ITERATION = 5
ITER_S_ESTIMATE = 0.01  # declared seconds per iteration (5 Adam steps of a 64-64-10 MLP, batch 128, one CPU core)


@salus_job(persistent="64MiB", ephemeral="256MiB")
@task
def train_job(job: int, iterations: int, submitted: float) -> dict:
    """A real (small) trainer: each Salus iteration is a few Adam steps of an MLP on digits."""
    import torch
    from sklearn.datasets import load_digits

    torch.set_num_threads(1)
    p = current_placement()
    x, y = load_digits(return_X_y=True)
    device = torch.device(p.device)
    xs, ys = torch.tensor(x / 16.0, dtype=torch.float32, device=device), torch.tensor(y, device=device)
    torch.manual_seed(job)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    spans = []
    for _ in salus_iterations(iterations):
        spans.append([time.time()])
        for _ in range(STEPS_PER_ITERATION):
            idx = torch.randint(0, len(xs), (128,), device=device)
            loss = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        spans[-1].append(time.time())
    accuracy = float((model(xs).argmax(1) == ys).float().mean())
    lane = p.lane
    return {"job": job, "iterations": iterations, "lane": lane.lane_id if lane else -1,
            "queued_s": spans[0][0] - submitted, "jct_s": time.time() - submitted, "accuracy": accuracy,
            "spans": spans}


def switch_gaps(rows: list[dict]) -> list[float]:
    """Seconds between one job's iteration ending and another job's starting in the same lane: the cost of a
    switch at an iteration boundary (token hand-off; no state moves, §2.3.2)."""
    gaps = []
    for lane in {r["lane"] for r in rows}:
        spans = sorted((s, e, r["job"]) for r in rows if r["lane"] == lane for s, e in r["spans"])
        gaps += [s2 - e1 for (_, e1, j1), (s2, _, j2) in zip(spans, spans[1:]) if j1 != j2 and s2 >= e1]
    return gaps


def runner_settings(parameters: dict) -> dict:
    """The flow's runner in Salus mode from its own parameters (``pool``, ``tracking``, ``policy``, and ``mode``:
    where the admitted jobs run, worker processes or threads)."""
    extra = {"salus_policy": parameters["policy"]} if parameters.get("policy") in POLICIES else {}
    if parameters.get("mode") in MODES:
        extra["salus_workers"] = parameters["mode"]
    return settings(parameters, DEFAULT_POOL, "gpuflows-salus", mode="salus", **extra)


def check(jobs: int, iterations: int, gap_s: float, policy: str) -> None:
    """The flow's parameters, checked by the flow and by ``main`` before a flow run starts."""
    integer(jobs, "jobs", minimum=1)
    integer(iterations, "iterations", minimum=1)
    positive(gap_s, "gap_s", allow_zero=True)
    choose(policy, "policy", list(POLICIES))


def trace(jobs: int, iterations: int) -> list[int]:
    """Iterations per job: long and short jobs alternate (1x, 1/4, 1/2 ...), so SRTF and FIFO differ."""
    return [max(1, iterations // (1, 4, 2)[j % 3]) for j in range(jobs)]


@flow(name="salus-colocation", log_prints=True, task_runner=GpuTaskRunner(mode="salus", configure=runner_settings))
def colocation(jobs: int = 6, iterations: int = 40, gap_s: float = 0.5, policy: str = "fair",
               pool: GpuPool | str | None = None, mode: str = "process",
               tracking: MlflowTarget | bool | str | None = None) -> dict:
    """Run ``jobs`` trainers on one device under a Salus ``policy``; return per-job rows and the summary.

    Args:
        jobs, iterations: how many jobs, and the longest job's Salus iterations (others 1/4 and 1/2 of it).
        gap_s: seconds between job arrivals.
        policy: fifo, pack, srtf, fair or weighted_fair (the device executor's iteration scheduler).
        pool: GpuPool block, saved block name, or None (pool "salus": NVML GPUs, else a simulated 16 GiB device).
        mode: "process" (one worker per admitted job) or "thread".
        tracking: MlflowTarget block, saved block name, False, or None for the default target.
    """
    check(jobs, iterations, gap_s, policy)
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    publish_mlflow_link()
    log_flow_inputs("salus", policy, {"jobs": jobs, "iterations": iterations, "gap_s": gap_s, "policy": policy,
                                      "mode": mode})
    futures, start = [], time.time()
    for j, n in enumerate(trace(jobs, iterations)):
        if j:
            time.sleep(gap_s)  # the trace's arrivals
        with salus_options(expected_s=n * ITER_S_ESTIMATE):  # SRTF assumes known durations (§2.4.2)
            futures.append(train_job.with_options(name=f"job{j}-{n}it").submit(j, n, time.time()))
    rows = [f.result() for f in futures]
    jct = np.array([r["jct_s"] for r in rows])
    summary = {"makespan_s": time.time() - start, "avg_jct_s": float(jct.mean()),
               "p95_jct_s": float(np.percentile(jct, 95)), "avg_queuing_s": float(np.mean([r["queued_s"] for r in rows])),
               "lanes": float(len({r["lane"] for r in rows}))}
    gaps = switch_gaps(rows)
    if gaps:
        summary.update(switches=float(len(gaps)), switch_ms_median=1e3 * float(np.median(gaps)),
                       switch_ms_p95=1e3 * float(np.percentile(gaps, 95)))
    log_flow_outcome(summary)
    table = [{k: v for k, v in r.items() if k != "spans"} for r in rows]
    publish_table(f"salus-jobs-{policy.replace('_', '-')}", table, f"Salus {policy}: one row per job")
    return {"policy": policy, "jobs": rows, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.colocation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=6, help="number of jobs (default 6)")
    parser.add_argument("--iterations", type=int, default=40, help="the longest job's Salus iterations (default 40)")
    parser.add_argument("--gap-s", type=float, default=0.5, help="seconds between arrivals (default 0.5)")
    parser.add_argument("--policy", default="fair", help=f"one of {sorted(POLICIES)} (default fair)")
    parser.add_argument("--mode", choices=MODES, default="process", help="runner mode")
    parser.add_argument("--pool", default="salus", help="pool name (flows naming the same pool share it)")
    parser.add_argument("--simulated", type=simulated, default="1x16GiB", help="simulated devices when no GPU is found")
    parser.add_argument("--no-tracking", action="store_true", help="switch MLflow tracking off")
    args = parser.parse_args(argv)
    try:  # before a Prefect server starts
        check(args.jobs, args.iterations, args.gap_s, args.policy)
        pool_path(args.pool)
    except GpuflowsError as exc:
        return error(exc)
    out = colocation(args.jobs, args.iterations, args.gap_s, args.policy,
                     pool=GpuPool(name=args.pool, simulated=args.simulated), mode=args.mode,
                     tracking=MlflowTarget(enabled=not args.no_tracking))
    print(f"{'job':>4} {'iters':>6} {'lane':>5} {'queued s':>9} {'JCT s':>7} {'acc':>5}")
    for r in out["jobs"]:
        print(f"{r['job']:>4} {r['iterations']:>6} {r['lane']:>5} {r['queued_s']:>9.2f} {r['jct_s']:>7.2f} "
              f"{r['accuracy']:>5.2f}")
    print(", ".join(f"{k} {v:.2f}" for k, v in out["summary"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
