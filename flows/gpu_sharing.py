"""Salus on real torch jobs: one trace of trainers and inference loops sharing one pool device, run under each
policy (thesis Ch. 2, the Table 2.1 experiment scaled down to seconds).

The trace (``tasks.salus.trace``: seeded, a Table A.1-like mix of trainers and S5-like inference loops, or jobs
given one by one; each job a torch stand-in whose memory is its workload's at ``tasks.salus.standin.MEMORY_SCALE``)
is submitted at its arrival times to a Salus executor on one pool device, once per policy (FIFO, PACK, SRTF, FAIR
by default). Before the first job each stand-in runs alone and is measured (``tasks.salus.standin.measure``). The
executor admits each job into a memory lane (Algorithm 2.1) by its persistent and ephemeral memory, declared as
measured or profiled over its own first iterations, and its policy picks, at every iteration boundary, which job
of a lane runs next (§2.4): SRTF by each job's measured iteration time x its iterations left, the measured
stand-in's time only a prior (``gpu.schedulers.salus.estimates``). Per policy: an MLflow run nested under the
flow's (makespan, queuing, average and p95 JCT, switch latency, peak lanes, the simulator's prediction as
``sim_<metric>``, the lane Gantt chart, every job's iteration spans), a Prefect table ``salus-jobs-<policy>``
(one row per job) and the chart ``salus-lanes-<policy>``; at the end the table ``salus-policies`` compares the
policies, measured beside what ``gpu.sim.salus`` predicts for the same jobs. On a simulated pool lanes are memory
accounting only (the jobs run on the CPU; tokens and policies are real).

    python -m flows.gpu_sharing --jobs 8 --policies fifo srtf
"""

from __future__ import annotations

import sys
import textwrap
import time
from typing import Any, Sequence

from prefect import flow

from gpu.errors import ConfigError, GpuflowsError
from gpu.pool import pool_path
from gpu.scenario import MAX_SEED, choose, integer, names
from gpu.schedulers.salus.lanes import Margins
from gpu.schedulers.salus.policies import POLICIES
from gpuflows.args import add_runner_arguments, error, flow_parser
from resource_blocks import GpuPool, MlflowTarget
from tasks.report.records import Records
from tasks.runtime.flow import (RunIdentity, log_flow_inputs, log_flow_outcome, pool_block, publish_mlflow_link,
                                run_namer, settings, tracking_target)
from tasks.runtime.runners import GpuTaskRunner
from tasks.runtime.tracking import ExperimentView
from tasks.salus.admission import SalusColocation, salus_executor
from tasks.salus.executor import MIB, salus_options
from tasks.salus.outcomes import METRICS, PolicyOutcome, executor_record, job_rows, predicted, solo_iteration_s
from tasks.salus.records import ACCOUNTING_ONLY, SIM_NOTE, publish_comparison, publish_policy
from tasks.salus.standin import MEMORY_SCALE, measure
from tasks.salus.trace import JOB_TASKS, SharingJob, explicit_trace, sharing_trace, warm_up

MODES = ("process", "thread")
MEMORY = ("declared", "profiled")
DEFAULT_POLICIES = ("fifo", "pack", "srtf", "fair")
DEFAULT_POOL = GpuPool(name="salus", simulated="1x16MiB")
"""The thesis's 16 GB P100 at the stand-ins' ``MEMORY_SCALE``: the trace's lanes bind here as Table A.1's did there."""
MARGINS = Margins(reserve_mb=Margins().reserve_mb * MEMORY_SCALE)
"""The authors' margins, their 300 MB reserve (of a 16 GB device) scaled like the stand-ins' memory."""
DEVICE = 0
MAX_JOBS = 8  # jobs admitted at once on the device (in process mode: its worker processes)


VIEW = ExperimentView(
    "Salus: each run compares the policies on one trace within itself (table `salus-policies`; a nested run per "
    "policy). Across runs, compare `memory` = `declared` against `profiled` on the same `seed`. Lower average JCT "
    "wins (thesis Table 2.1: SRTF 3.19x better than FIFO); `sim_*` metrics are the simulator's prediction for the "
    "same jobs, from iteration times measured alone.",
    metrics=("fifo_avg_jct_s", "srtf_avg_jct_s", "pack_makespan_s", "fair_avg_jct_s"),
    params=("policies", "memory", "jobs", "seed"))


def identity(parameters: dict) -> RunIdentity:
    """Experiment ``gpuflows-salus``; runs named by the policies compared and how memory was known:
    ``salus-fifo+pack+srtf+fair-declared-<time>``."""
    policies = parameters.get("policies")
    chosen = "+".join(map(str, policies)) if isinstance(policies, (list, tuple)) else "+".join(DEFAULT_POLICIES)
    return RunIdentity("salus", (chosen, str(parameters.get("memory", "declared"))))


def runner_settings(parameters: dict) -> dict:
    """The flow's runner from its own parameters (``pool``, ``tracking``): it opens the flow's MLflow run; each
    policy's jobs run on a runner with a Salus admission of their own on the same pool (``run_policy``)."""
    return settings(parameters, DEFAULT_POOL, identity(parameters).experiment)


def prepare(pool: GpuPool | str | dict | None, tracking: MlflowTarget | bool | str | None, *, jobs: int, seed: int,
            gap_s: float, median_iterations: int, trace: list[dict] | None, policies: list[str] | None, mode: str,
            memory: str, **_: Any) -> tuple[list[SharingJob], list[str], GpuPool, MlflowTarget]:
    """The trace, the policies, the pool and the MLflow target, every parameter checked: the flow calls it for
    deployment runs, ``main`` before the flow, so a bad argument fails before a flow run starts."""
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    choose(memory, "memory", list(MEMORY))
    chosen = list(DEFAULT_POLICIES) if policies is None else names(policies, "policies")
    if not chosen or len(set(chosen)) != len(chosen):
        raise ConfigError("policies", policies, "name each policy once, at least one")
    for p in chosen:
        choose(p, "policies", list(POLICIES))
    integer(seed, "seed", minimum=0, maximum=MAX_SEED)
    jobs_ = explicit_trace(trace) if trace is not None else sharing_trace(jobs, seed, gap_s, median_iterations)
    return jobs_, chosen, pool_block(pool, DEFAULT_POOL), tracking_target(tracking, identity({}).experiment)


def run_policy(trace: Sequence[SharingJob], policy: str, pool: GpuPool, mode: str, memory: str) -> PolicyOutcome:
    """Submit the trace at its arrival times to a runner with a Salus admission under ``policy`` on device 0 of ``pool``
    (its jobs in worker processes or threads, ``mode``; their memory declared as their stand-ins measured it or
    profiled by the executor, ``memory``); the jobs' measured rows once all are done. Each job declares, as SRTF's
    prior, its iterations x its stand-in's measured iteration time; from its first measured iteration on, SRTF
    goes by what the job itself measures. The runner leases the device for the policy's run and gives it back
    when it exits, however the run ended. A runner of its own per policy, not the flow's: an executor's policy
    is fixed for its life. Its MLflow tracking is off (the flow's runner holds the flow run's one MLflow run);
    each job's record goes into the policy's nested run instead (``jobs.json``)."""
    runner = GpuTaskRunner(pool=pool, mode=mode, tracking=False, admission=SalusColocation(
        policy=policy, devices=(DEVICE,), max_jobs_per_device=min(len(trace), MAX_JOBS), margins=MARGINS))
    with runner:
        executor = salus_executor(runner, DEVICE)
        device_mb = executor.controller.lanes.capacity_mb
        lease = executor.placement
        device = "cpu" if lease is None or lease.simulated else f"cuda:{DEVICE}"
        measured = {job.job_id: measure(job.shape, device) for job in trace}  # once per stand-in and process
        submitted = []
        t0 = time.time()
        for i, job in enumerate(trace):
            time.sleep(max(0.0, t0 + job.arrival_s - time.time()))  # the trace's arrival process
            arrived = time.time()  # before submit: the first submit starts the executor, and the job may run meanwhile
            m = measured[job.job_id]
            declared = {"persistent": int(m.persistent_mb * MIB), "ephemeral": int(m.ephemeral_mb * MIB)}
            with salus_options(expected_s=job.iterations * m.iteration_s,
                               **(declared if memory == "declared" else {})):
                task = JOB_TASKS[job.kind].with_options(name=f"{policy}-{job.job_id}-{job.workload}")
                future = runner.submit(task, {"job_id": job.job_id, "hidden": job.hidden, "batch": job.batch,
                                              "iterations": job.iterations, "seed": i})
            submitted.append((arrived, future))
        results = [future.result() for _, future in submitted]
        sizes, grants, queued = executor_record(
            executor, {j: (m.persistent_mb, m.ephemeral_mb) for j, m in measured.items()}, f"{policy}-")
    rows = job_rows(trace, results, [at for at, _ in submitted], t0, sizes, grants, queued)
    return PolicyOutcome(policy, rows, device_mb, simulated_device=any(r["device"] == "cpu" for r in results),
                         sizes=sizes, margins=MARGINS)


@flow(name="salus-gpu-sharing", log_prints=True, flow_run_name=run_namer(identity),
      task_runner=GpuTaskRunner(configure=runner_settings))
def gpu_sharing(jobs: int = 8, seed: int = 0, gap_s: float = 0.1, median_iterations: int = 20,
                trace: list[dict] | None = None, policies: list[str] | None = None,
                memory: str = "declared", pool: GpuPool | str | None = None, mode: str = "process",
                tracking: MlflowTarget | bool | str | None = None) -> dict:
    """Run one job trace under each Salus policy on one pool device; return each policy's jobs and metrics,
    measured and simulated.

    Args:
        jobs, seed, gap_s, median_iterations: the seeded trace (``jobs`` jobs, arrivals ``gap_s`` apart on
            average, iterations log-normal around ``median_iterations``).
        trace: jobs given one by one instead, ``[{kind: train|infer, workload, iterations, arrival_s}]``.
        policies: Salus policies to run the trace under (default fifo, pack, srtf, fair).
        memory: "declared" (each job declares the memory its stand-in measured alone before the run) or
            "profiled" (jobs declare none: the runner measures what each one allocates over its first iterations).
        pool: GpuPool block, saved block name, or None (pool "salus" on a simulated 16 MiB device, the P100's
            16 GB at the stand-ins' memory scale; on NVML GPUs the machine's one pool, "default").
        mode: "process" (each job its own worker process, its memory capped at its lane) or "thread".
        tracking: MlflowTarget block, saved block name, False, or None for the default target.
    """
    trace_, chosen, block, _ = prepare(pool, tracking, jobs=jobs, seed=seed, gap_s=gap_s,
                                       median_iterations=median_iterations, trace=trace, policies=policies, mode=mode,
                                       memory=memory)
    publish_mlflow_link()
    log_flow_inputs(identity({"policies": chosen, "memory": memory}), {
        "jobs": len(trace_), "seed": seed, "gap_s": gap_s, "median_iterations": median_iterations,
        "explicit_trace": trace is not None, "policies": ",".join(chosen), "mode": mode, "memory": memory}, VIEW)
    if mode == "thread":
        warm_up()
    outcomes = [run_policy(trace_, policy, block, mode, memory) for policy in chosen]
    iter_s = solo_iteration_s(outcomes)
    records = Records.of_flow()
    comparison = []
    for outcome in outcomes:
        sim = predicted(trace_, outcome, iter_s)
        publish_policy(records, outcome, sim)
        comparison.append({"policy": outcome.policy,
                           **{k: outcome.summary[k] for k in (*METRICS, "peak_lanes", "queued_on_arrival")},
                           **{f"sim_{k}": v for k, v in sim.items()}})
    note = ACCOUNTING_ONLY if any(o.simulated_device for o in outcomes) else ""
    publish_comparison(records, comparison, note)
    log_flow_outcome({f"{row['policy']}_{k}": v for row in comparison for k, v in row.items() if k != "policy"})
    return {"trace": [j.row() for j in trace_], "policies": {o.policy: {"jobs": o.jobs, "summary": o.summary}
                                                            for o in outcomes},
            "comparison": comparison, "note": note, "mlflow_errors": records.errors}


def print_comparison(out: dict) -> None:
    """Policy by policy: makespan, average and p95 JCT, jobs queued for memory, measured, and the simulator's beside
    them."""
    print(f"{'policy':<14}{'makespan s':>11}{'sim':>7}{'avg JCT s':>11}{'sim':>7}{'p95 JCT s':>11}{'sim':>7}"
          f"{'lanes':>7}{'queued':>8}{'sim':>5}{'switch ms':>11}")
    for row in out["comparison"]:
        switch = out["policies"][row["policy"]]["summary"].get("switch_ms_median")
        print(f"{row['policy']:<14}{row['makespan_s']:>11.2f}{row['sim_makespan_s']:>7.2f}{row['avg_jct_s']:>11.2f}"
              f"{row['sim_avg_jct_s']:>7.2f}{row['p95_jct_s']:>11.2f}{row['sim_p95_jct_s']:>7.2f}"
              f"{int(row['peak_lanes']):>7}{int(row['queued_on_arrival']):>8}{int(row['sim_queued_on_arrival']):>5}"
              f"{'-' if switch is None else f'{switch:.2f}':>11}")
    print(textwrap.fill(SIM_NOTE, 118))
    if out["note"]:
        print(out["note"])


def main(argv: list[str] | None = None) -> int:
    parser = flow_parser("flows.gpu_sharing", __doc__)
    parser.add_argument("--jobs", type=int, default=8, help="jobs in the seeded trace (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the trace (default 0)")
    parser.add_argument("--gap-s", type=float, default=0.1, help="mean seconds between arrivals (default 0.1)")
    parser.add_argument("--median-iterations", type=int, default=20, help="median Salus iterations per job (default 20)")
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES),
                        help=f"policies, of {sorted(POLICIES)} (default {' '.join(DEFAULT_POLICIES)})")
    parser.add_argument("--memory", default="declared",
                        help=f"jobs' memory, one of {MEMORY}: as their stand-ins measured it before the run, or "
                             "profiled by the runner on admission (default declared)")
    add_runner_arguments(parser, MODES, pool=None, simulated_devices="1x16MiB")
    args = parser.parse_args(argv)
    kwargs = dict(jobs=args.jobs, seed=args.seed, gap_s=args.gap_s, median_iterations=args.median_iterations,
                  trace=None, policies=args.policies, mode=args.mode, memory=args.memory,
                  tracking=False if args.no_tracking else None)
    try:  # before a Prefect server starts
        pool = GpuPool(name=args.pool or DEFAULT_POOL.name, simulated=args.simulated)
        if args.pool:
            pool_path(args.pool)
        _, _, kwargs["pool"], kwargs["tracking"] = prepare(pool if args.pool else pool.on_this_machine(), **kwargs)
    except GpuflowsError as exc:
        return error(exc)
    print_comparison(gpu_sharing(**kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
