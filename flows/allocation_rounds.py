"""Cilantro allocation rounds as a Prefect flow (thesis ch. 3, §3.3 Fig. 3.3, §3.4, §3.7).

Jobs — by default two torch inference services replaying the Cilantro Twitter trace and one torch
training job (``tasks.cilantro.jobs``) — share ``capacity`` GPU units of a pool. The decisions are taken
by :class:`gpu.schedulers.cilantro.controller.CilantroRound`, the controller the simulator drives too; this flow
is its world with measured outcomes. Every round:

1. **run** — every job runs the round as a Prefect task placed by ``GpuTaskRunner`` on a slice of its
   allocation (``with gpu_options(gpus=a_j)``); it really serves its requests (or takes its training steps)
   with its torch model, times each on its slice (``tasks.runtime.slices.on_slice``) and reports the SLO attainment
   or steps/s it measured, per report period;
2. **learn and decide** — ``on_round(now, reports)`` folds the reports into each job's interval-tree learner
   and ARIMA load forecaster (the first ``warmup_reports`` of each job are skipped) and decides the next
   round: load UCBs from the forecasters (services; ℓ ≡ 1 for training), performance bounds on the grid
   ``unit · {0, 1, …}`` from the learners (``policy.learner == "online"``) or nothing (``"none"``), the
   policy's allocation ``{job: GPUs}``. W_S, W_E and F_NJC (eqs. 3.1–3.3) are computed from the reports;
3. **keep** — the whole state (learners, forecasters, policy, RNG, the next round's decision, checkpoints,
   the round's MLflow record) is written to ``state_dir()/cilantro/<run_name>.json``, then the round is
   logged as an MLflow run nested under the flow's run (a crash in between logs it on the next run, once).
   A job whose task fails keeps its learner unchanged, scores utility 0 for the round (F_NJC counts it as
   fully deprived), and the next round goes on.

Oracle policies need the jobs' true curves, which only the simulator has (``gpuflows simulate cilantro``);
the flow refuses them.

``rounds`` is how many rounds *this* flow run executes: with ``resume=True`` a run named like an
earlier one continues after that run's last completed round, so a killed flow loses at most the
round in progress and a scheduled deployment keeps learning across runs.

Allocations are in GPU units. With ``capacity <= 1`` every job holds a fraction of one device
(``unit`` is the fraction granularity, e.g. 0.05); a larger capacity needs a whole ``unit`` (whole
GPUs) because the pool grants fractions only within one device.

    python -m flows.allocation_rounds --rounds 3 --policy cilantro-njc
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from typing import Any

from prefect import flow

from gpu.devices import discover
from gpu.errors import ConfigError
from gpu.scenario import MAX_COUNT, MAX_GPUS, MAX_SEED, integer, positive
from gpu.schedulers.cilantro.policies import POLICIES, make_policy
from gpu.schedulers.cilantro.fair import ResourceFair
from gpu.schedulers.cilantro.types import JobSpec
from gpuflows.args import add_runner_arguments, flow_arguments, flow_parser, output_file, run_checked
from resource_blocks import GpuPool, MlflowTarget
from tasks.cilantro.allocator import RoundSettings, run_lock
from tasks.cilantro.jobs import JobConfig
from tasks.runtime.flow import (RunIdentity, flow_runner, log_flow_inputs, log_flow_outcome, pool_block,
                                publish_mlflow_link, run_namer, settings, tracking_target)
from tasks.cilantro.rounds import run_rounds
from tasks.runtime.runners import GpuTaskRunner
from tasks.runtime.tracking import ExperimentView

MODES = ("process", "thread")
_SLO_FREE = (ResourceFair,)  # the only policy whose decision never reads a performance or an SLO
MAX_ROUNDS = 10_000  # rounds of real work, each round_s long
MAX_ROUND_S = 24 * 3_600.0  # a round (and a report period) of at most a day
_RUN_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,99}$")  # Prefect artifact keys: lowercase letters, digits, '-'

DEFAULT_JOBS: tuple[JobConfig, ...] = (  # sized for one CPU core per simulated GPU (see docs/cilantro.md)
    JobConfig("svc-a", "service", 0.95, "linear", scale_ms=0.6, base_load=400.0, latency_slo_ms=20.0, trace_offset=0,
              hidden=1024, rows=256),
    JobConfig("svc-b", "service", 0.90, "sqrt", scale_ms=0.6, base_load=250.0, latency_slo_ms=20.0, trace_offset=700,
              hidden=2048, rows=128),
    JobConfig("trainer", "training", 120.0, "linear", scale_ms=2.2, hidden=1024, rows=256),
)


def _jobs(jobs: list[dict] | None) -> tuple[JobConfig, ...]:
    if jobs is None:
        return DEFAULT_JOBS
    if not isinstance(jobs, (list, tuple)) or not jobs:
        raise ConfigError("jobs", jobs, "must be a non-empty list of job mappings")
    out = []
    for i, raw in enumerate(jobs):
        if not isinstance(raw, dict) or "name" not in raw or "kind" not in raw:
            raise ConfigError(f"jobs[{i}]", raw, "needs at least 'name' and 'kind'")
        unknown = sorted(set(raw) - set(JobConfig.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"jobs[{i}].{unknown[0]}", raw[unknown[0]], "unknown job field")
        out.append(JobConfig(**{"slo": None, **raw}))
    names = [j.name for j in out]
    if len(set(names)) != len(names):
        raise ConfigError("jobs", names, "job names must be unique")
    return tuple(out)


def settings_from(*, rounds: int, round_s: float, policy: str, capacity: float, unit: float, resume: bool,
                  run_name: str, jobs: list[dict] | None, report_s: float, max_change: float | None, trace_step: int,
                  warmup_reports: int, seed: int, pool_gpus: int) -> RoundSettings:
    """Validate the flow's parameters; every bad value raises one ConfigError naming it."""
    if isinstance(rounds, bool) or not isinstance(rounds, int):
        raise ConfigError("rounds", rounds, "must be a whole number >= 1")
    integer(rounds, "rounds", minimum=1, maximum=MAX_ROUNDS)
    if not isinstance(run_name, str) or not _RUN_NAME.match(run_name):
        raise ConfigError("run_name", run_name, "use lowercase letters, digits and '-' (it names the state file "
                                                "and the flow's Prefect artifact key, which allows nothing else)")
    seed = integer(seed, "seed", minimum=0, maximum=MAX_SEED)  # numpy's seed sequences refuse negatives
    chosen = make_policy(policy)  # ConfigError naming ``policy`` if unknown
    if chosen.learner == "oracle":
        raise ConfigError("policy", policy, "an oracle is given each job's true curve, which only the simulator "
                                            "knows (gpuflows simulate cilantro); the flow measures, so choose a "
                                            "learning policy such as cilantro-" + policy.split("-")[-1])
    capacity = positive(capacity, "capacity", upper=MAX_GPUS)
    if capacity > pool_gpus:
        raise ConfigError("capacity", capacity, f"the pool has only {pool_gpus} GPU(s)")
    unit = positive(unit, "unit", upper=MAX_GPUS)
    if unit > capacity:
        raise ConfigError("unit", unit, f"must not exceed capacity={capacity:g}")
    if capacity > 1 and unit != int(unit):
        raise ConfigError("unit", unit, "a capacity above one GPU needs whole-GPU units (fractions share one device)")
    round_s, report_s = positive(round_s, "round_s", upper=MAX_ROUND_S), positive(report_s, "report_s",
                                                                                  upper=MAX_ROUND_S)
    if report_s > round_s:
        raise ConfigError("report_s", report_s, f"must not exceed round_s={round_s:g}")
    if max_change is not None:
        max_change = positive(max_change, "max_change", allow_zero=True, upper=MAX_GPUS)
    if isinstance(trace_step, bool) or not isinstance(trace_step, int):
        raise ConfigError("trace_step", trace_step, "must be a whole number >= 1")
    integer(trace_step, "trace_step", minimum=1, maximum=MAX_COUNT)
    if isinstance(warmup_reports, bool) or not isinstance(warmup_reports, int):
        raise ConfigError("warmup_reports", warmup_reports, "must be a whole number >= 0")
    integer(warmup_reports, "warmup_reports", minimum=0, maximum=MAX_COUNT)
    job_cfgs = _jobs(jobs)
    for j in job_cfgs:
        JobSpec(j.name, j.slo, j.utility, j.weight, j.kind)  # validates slo > 0, utility shape, weight
        if j.slo is None and not isinstance(chosen, _SLO_FREE):
            raise ConfigError(f"{j.name}.slo", None, f"policy {policy!r} needs an SLO for every job")
    return RoundSettings(run_name, policy, rounds, round_s, report_s, capacity, unit, max_change, trace_step,
                         warmup_reports, seed, bool(resume), job_cfgs)


DEFAULT_POOL = GpuPool(name="cilantro", simulated="1x16GiB")


VIEW = ExperimentView(
    "Cilantro: compare policies on the same jobs (`cilantro-njc` against `cilantro-ew`, `cilantro-sw` and the "
    "baselines), over the same `rounds`. Higher `mean_njc_fairness` (F_NJC, eq. 3.3) is fairer, higher "
    "`mean_social_welfare` (W_S, eq. 3.1) and `mean_egalitarian_welfare` (W_E, eq. 3.2) serve more; each round is a "
    "nested run with its allocation.",
    metrics=("mean_njc_fairness", "mean_social_welfare", "mean_egalitarian_welfare", "rounds_failed"),
    params=("policy", "run_name", "rounds", "round_s"))


def identity(parameters: dict) -> RunIdentity:
    """Experiment ``gpuflows-cilantro``; runs named by policy and the run whose state they resume:
    ``cilantro-njc-prod-<time>`` for policy cilantro-njc, run_name cilantro-prod."""
    run_name = str(parameters.get("run_name", "cilantro"))
    return RunIdentity("cilantro", (str(parameters.get("policy", "cilantro-njc")),
                                    run_name.removeprefix("cilantro-") if run_name != "cilantro" else None))


def runner_settings(parameters: dict) -> dict:
    """The flow's GPU task runner from its own parameters: ``pool``, ``mode``, ``tracking``, and a worker
    process per job (every job runs each round at once)."""
    jobs = parameters.get("jobs")
    return settings(parameters, DEFAULT_POOL, identity(parameters).experiment,
                    workers_per_device_set=max(1, len(jobs) if isinstance(jobs, (list, tuple)) else len(DEFAULT_JOBS)))


@flow(name="cilantro-allocation-rounds", flow_run_name=run_namer(identity),
      task_runner=GpuTaskRunner(configure=runner_settings))
def allocation_rounds(rounds: int = 3, round_s: float = 10.0, policy: str = "cilantro-njc",
                      pool: GpuPool | str | None = None, capacity: float = 1.0, unit: float = 0.05,
                      resume: bool = True, run_name: str = "cilantro", jobs: list[dict] | None = None,
                      report_s: float = 2.5, max_change: float | None = 0.2, trace_step: int = 10,
                      warmup_reports: int = 0, seed: int = 0, mode: str = "process",
                      tracking: MlflowTarget | bool | str | None = None) -> dict:
    """Run ``rounds`` Cilantro allocation rounds of real jobs sharing ``capacity`` GPUs of ``pool``.

    Args:
        rounds: rounds this flow run executes (after the saved ones when resuming).
        round_s, report_s: seconds of each slice's own clock per round and per job report (the paper: 120 s and
            10 s; a round costs up to ``round_s`` of real compute, so the default rounds are shorter).
        policy: a Cilantro policy name (``gpu.schedulers.cilantro.policies.POLICIES``), e.g. cilantro-njc, cilantro-ew.
        pool: GpuPool block, the name of a saved one, or None (a simulated 1 x 16 GiB pool "cilantro"; on NVML GPUs
            the machine's one pool, "default").
        capacity: GPU units shared by the jobs (<= the pool's GPUs); unit: allocation granularity.
        resume: continue the saved state of ``run_name`` (``state_dir()/cilantro/<run_name>.json``).
        jobs: job mappings (``tasks.cilantro.jobs.JobConfig`` fields); None = 2 services + 1 trainer.
        max_change: B, the largest change of a job's allocation per round in GPU units (None: unbounded).
        trace_step: trace values advanced per report (time compression of the Twitter trace).
        warmup_reports: reports per job ignored by its learner.
        mode: GpuTaskRunner mode, "process" or "thread".
        tracking: MlflowTarget block, the name of a saved one, False to switch MLflow off, None for the default target.

    Returns:
        ``{"run_name", "policy", "start_round", "next_round", "resumed", "rounds": [{"round",
        "allocation", "utilities", "social_welfare", "egalitarian_welfare", "njc_fairness",
        "decision_s", "failed", ...}], "state_path", "mlflow_run_id", "mlflow_errors"}`` (what could not
        be logged to MLflow; empty when all was).
    """
    block, _, s = prepare(pool, mode, tracking, rounds=rounds, round_s=round_s, policy=policy,
                          capacity=capacity, unit=unit, resume=resume, run_name=run_name, jobs=jobs,
                          report_s=report_s, max_change=max_change, trace_step=trace_step,
                          warmup_reports=warmup_reports, seed=seed)
    with run_lock(s.run_name):
        parent = publish_mlflow_link(flow_runner()) if s.tracking_uri else None
        log_flow_inputs(identity({"policy": policy, "run_name": run_name}), {
            "policy": policy, "rounds": rounds, "round_s": round_s, "pool": block.name, "capacity": capacity,
            "unit": unit, "max_change": max_change, "jobs": len(jobs) if jobs is not None else "default", "seed": seed,
            "run_name": run_name, "resume": resume, "mode": mode}, VIEW)
        summary = run_rounds(s, parent)
        log_flow_outcome(_outcome(summary["rounds"]))
        return summary


def prepare(pool: GpuPool | str | None, mode: str, tracking: MlflowTarget | bool | None,
            **params: Any) -> tuple[GpuPool, MlflowTarget, RoundSettings]:
    """The flow's pool, MLflow target and settings, every parameter checked (``settings_from``): the flow calls
    it for deployment runs, ``main`` before the flow, so a bad argument fails before a flow run starts."""
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    runner = flow_runner()  # in the flow run: the pool and target its runner resolved from these parameters
    block = runner.pool if runner else pool_block(pool, DEFAULT_POOL)
    target = runner.tracking if runner else tracking_target(tracking, identity(params).experiment)
    s = settings_from(**params, pool_gpus=discover(block.simulated, block.device_backend).gpu_count)
    s = replace(s, tracking_uri=target.resolved_uri() if target.enabled else None,
                experiment=target.resolved_experiment())
    return block, target, s


def _outcome(rows: list[dict]) -> dict[str, float]:
    """The headline of this flow run's rounds: mean W_S, W_E and F_NJC, decision time, failed rounds."""
    if not rows:
        return {}
    def mean(key: str) -> float | None:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else None

    return {"mean_social_welfare": mean("social_welfare"), "mean_egalitarian_welfare": mean("egalitarian_welfare"),
            "mean_njc_fairness": mean("njc_fairness"), "mean_decision_s": mean("decision_s"),
            "rounds_run": float(len(rows)), "rounds_failed": float(sum(bool(r.get("failed")) for r in rows))}


def format_summary(summary: dict) -> str:
    """One line per round: allocation per job, utilities and the three metrics."""
    lines = [f"run {summary['run_name']} policy={summary['policy']} rounds {summary['start_round']}"
             f"..{summary['next_round'] - 1} ({'resumed' if summary['resumed'] else 'fresh'})"]
    for row in summary["rounds"]:
        alloc = " ".join(f"{n}={a:.2f}" for n, a in row["allocation"].items())
        util = " ".join(f"{n}={u:.2f}" for n, u in row["utilities"].items())
        metrics = "  ".join(f"{k}={row[k]:.3f}" for k in ("social_welfare", "egalitarian_welfare", "njc_fairness")
                            if k in row)
        failed = f"  failed: {','.join(row['failed'])}" if row["failed"] else ""
        lines.append(f"round {row['round']:3d}  alloc[{alloc}]  utility[{util}]  {metrics}  "
                     f"decide={row['decision_s'] * 1e3:.1f}ms{failed}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = flow_parser("flows.allocation_rounds", __doc__)
    parser.add_argument("--rounds", type=int, default=3, help="rounds to run now (default 3)")
    parser.add_argument("--round-s", type=float, default=10.0,
                        help="seconds of slice time per round (default 10; costs up to that much compute)")
    parser.add_argument("--report-s", type=float, default=2.5, help="seconds per job report (default 2.5)")
    parser.add_argument("--policy", default="cilantro-njc", help=f"one of {sorted(POLICIES)} (default cilantro-njc)")
    parser.add_argument("--capacity", type=float, default=1.0, help="GPU units shared by the jobs (default 1)")
    parser.add_argument("--unit", type=float, default=0.05, help="allocation granularity in GPUs (default 0.05)")
    parser.add_argument("--max-change", type=float, default=0.2, help="largest per-round change per job (default 0.2)")
    parser.add_argument("--run-name", default="cilantro", help="names the saved state (default cilantro)")
    parser.add_argument("--no-resume", action="store_true", help="start from scratch instead of the saved state")
    parser.add_argument("--seed", type=int, default=0)
    add_runner_arguments(parser, MODES, pool=None, simulated_devices="1x16GiB")
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the summary as JSON")
    args = parser.parse_args(argv)
    kwargs = flow_arguments(
        allocation_rounds, rounds=args.rounds, round_s=args.round_s, report_s=args.report_s, policy=args.policy,
        pool=args.pool or GpuPool(name="cilantro", simulated=args.simulated).on_this_machine(),
        capacity=args.capacity, unit=args.unit, max_change=args.max_change, resume=not args.no_resume,
        run_name=args.run_name, seed=args.seed, mode=args.mode, tracking=False if args.no_tracking else None)
    return run_checked(allocation_rounds, prepare, kwargs, format_summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
