"""FLUID hyperparameter TrialGroups as a Prefect flow: a tuning algorithm's trials on GPU-pool slices.

The tuning algorithm (``gpu.schedulers.fluid.tuning``) hands out TrialGroups, FLUID (``FluidExecutor``: StaticFluid +
DynamicFluid, thesis §3.3.3) or the FIFO baseline decides each trial's width, and the ``GpuTaskRunner`` runs
every chunk of a trial's iterations as a real torch training task at that width on the GPUs FLUID chose
(``gpu_options(gpus=width, devices=gpus)``: widths < 1 share one device). Resizes apply at the next chunk
boundary from the trial's checkpoint. Completions are read with the public Prefect future API
(``as_completed``, ``future.state``) and fed back to the session; a failed trial is recorded (score 1.0 =
accuracy 0) and the search goes on. FLUID's inputs are measured (§3.5, ``tasks.fluid.profiling``): ``c``
and ``alpha`` from the device's packing curve (Eq. 3.1: the one ``benchmarks/fluid_packing.py`` saved, else a
short measurement at start-up), ``beta`` and ``d`` from the flow's MLP timed at several widths, and every
trial's seconds per iteration from a short run on a ``1/c`` slice, so its runtime is ``budget * t1``. The
controller runs on the flow's wall clock; the result and the MLflow run carry the makespan (``makespan_s``) and
each TrialGroup's. In process mode the runner keeps ``c`` workers per device, so ``c`` packed trials train at
once. MLflow: one child run per trial under the flow's run, the best model registered. ``--execution salus-pack``
packs the trials onto the pool's first device as Salus jobs under PACK instead (``tasks.fluid.salus``).

    python -m flows.trial_groups --algorithm grid --iterations 4
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from prefect import flow
from prefect.futures import as_completed

from gpu.devices import Node, discover
from gpu.errors import ConfigError, GpuflowsError
from gpu.scenario import MAX_COUNT, MAX_SEED, integer
from gpu.schedulers.fluid.algorithms import FluidParams, packing_limit
from gpu.schedulers.fluid.controller import Step
from gpu.schedulers.fluid.policies import build_executor, policy_names
from gpu.schedulers.fluid.session import TuningSession
from gpu.state import state_dir
from gpu.schedulers.fluid.tuning import ALGORITHMS, Choice, Grid, LogUniform, parse_space
from gpuflows.args import error, flow_arguments, flow_parser, output_file, run_checked
from resource_blocks import GpuPool, MlflowTarget
from tasks.fluid.escher import PLACEMENTS, EscherTrials, escher_trials, nodes_pool
from tasks.fluid.profiling import TrialProfiler, calibrate, trials_per_device
from tasks.fluid.salus import EXECUTION as SALUS_PACK, pack_search, salus_pack_runner
from tasks.fluid.records import TrialLog, best_result
from tasks.fluid.trials import load_model, train_chunk
from tasks.runtime.requests import gpu_options
from tasks.runtime.flow import (RunIdentity, flow_runner, log_flow_inputs, log_flow_outcome, pool_block,
                                publish_mlflow_link, run_namer, settings, tracking_target)
from tasks.runtime.runners import GpuTaskRunner
from tasks.runtime.tracking import ExperimentView, flow_tracker
from tasks.report.occupancy import publish_pool_occupancy
from tasks.report.progress import FlowProgress

SEARCHES = ("grid", "random", "hyperband", "asha", "bohb", "pbt")
EXECUTIONS = policy_names()  # fifo, static_fluid, fluid: every policy the simulator offers
MODES = ("process", "thread")
MAX_TRIALS = 10_000  # trials (and PBT generations) of one search: each is real torch work
GRID_SPACE = {"lr": Grid((0.01, 0.1)), "hidden": Grid((16, 64)), "batch_size": Choice((64,))}
RANDOM_SPACE = {"lr": LogUniform(0.003, 0.3), "hidden": Choice((16, 32, 64, 128)), "batch_size": Choice((32, 64, 128))}
TRIAL_IDS = {  # how FLUID's tuning algorithms name trials (config @ rung): a --fail-trial of another form never fails
    "grid": (r"c\d{4}@0", "c0001@0"), "random": (r"c\d{4}@0", "c0001@0"),
    "asha": (r"c\d{4}@\d+", "c0001@1"), "bohb": (r"c\d{4}@\d+", "c0001@1"),
    "hyperband": (r"c\d{4}@\d+\.\d+", "c0001@2.0"), "pbt": (r"m\d{3}@\d+", "m001@1")}


def make_algorithm(algorithm: str, trials: int, iterations: int, seed: int, space: dict | None,
                   min_iterations: int, generations: int):
    """The tuning algorithm of ``gpu.schedulers.fluid.tuning`` for this search (validated: one ConfigError naming the
    bad value)."""
    if algorithm not in SEARCHES:
        raise ConfigError("algorithm", algorithm, f"choose one of {SEARCHES}")
    integer(seed, "seed", minimum=0, maximum=MAX_SEED)  # numpy's generators refuse negatives
    for name, value, top in (("trials", trials, MAX_TRIALS), ("iterations", iterations, MAX_COUNT),
                             ("min_iterations", min_iterations, MAX_COUNT), ("generations", generations, MAX_TRIALS)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(name, value, "must be a whole number > 0")
        integer(value, name, maximum=top)
    sp = parse_space(space) if space is not None else (GRID_SPACE if algorithm == "grid" else RANDOM_SPACE)
    missing = {"lr", "hidden", "batch_size"} - set(sp)
    if missing:
        raise ConfigError("space", sorted(sp), f"missing hyperparameters {sorted(missing)}")
    cls = ALGORITHMS[algorithm]
    if algorithm == "grid":
        return cls(sp, iterations, seed=seed)
    if algorithm == "random":
        return cls(sp, iterations, num_samples=trials, seed=seed)
    if algorithm == "hyperband":
        return cls(sp, max_budget=iterations, min_budget=min_iterations, seed=seed)
    if algorithm in ("asha", "bohb"):
        return cls(sp, num_samples=trials, max_budget=iterations, min_budget=min_iterations, seed=seed)
    return cls(sp, population=max(2, trials), interval=max(1, iterations // generations), generations=generations,
               seed=seed)


def _finished(inflight: dict) -> list:
    """Wait for a chunk to finish, then every finished chunk in submission order.

    FIFO among finished chunks keeps a fast event (a failure freeing its slice) from waiting behind busy
    neighbours, so DynamicFluid sees it while they still have iterations to resize.
    Only public future API (``as_completed``, ``state.is_final()``), so any Prefect task runner's futures work.
    """
    first = next(as_completed(list(inflight)))
    return [f for f in inflight if f is first or f.state.is_final()]


def _search(algorithm: str, trials: int, iterations: int, seed: int, space: dict | None, min_iterations: int,
            generations: int, execution: str, gpus: list[int], device: str, c: int | None, d: int,
            alpha: float | None, packing_iterations: int, chunk: int, fail_trial: str | None, tracking_uri: str,
            model_name: str, progress: bool, parent: str | None, escher: EscherTrials | None = None) -> dict:
    """The search itself, in the flow run (its chunks on the flow's GPU task runner); ``parent``: its MLflow run;
    ``escher``: chunks run as ESCHER gangs over every node's GPUs (``tasks.fluid.escher``), else pinned to FLUID's."""
    algo = make_algorithm(algorithm, trials, iterations, seed, space, min_iterations, generations)
    log = TrialLog(parent, tracking_uri)
    cal = calibrate(execution, escher.slots if escher else gpus, device, c, d, alpha, packing_iterations, seed,
                    escher and (lambda widths: escher.scaling_times(widths, seed)))
    log.search(cal)
    executor = build_executor(execution, escher.slots if escher else gpus, FluidParams(c=cal.c, d=cal.d))
    profiler = TrialProfiler(1.0 / cal.c, cal.alpha, cal.beta, seed)
    session = TuningSession(algo, executor, profile=profiler)
    t0 = time.monotonic()
    now = lambda: time.monotonic() - t0  # noqa: E731 - the world's clock FLUID's controller is driven by
    ckpt_dir = state_dir() / "trial_groups" / (parent or f"{algorithm}-{execution}-{seed}")
    ckpt = lambda tid: str(ckpt_dir / f"{tid.replace('@', '_')}.pt")  # noqa: E731
    width: dict[str, float] = {}
    where: dict[str, tuple[int, ...]] = {}  # FLUID's GPUs for the trial's next chunk
    pinned: dict[Any, tuple[int, ...]] = {}  # the GPUs each submitted chunk was pinned to
    done_iters: dict[str, int] = {}
    inflight: dict[Any, str] = {}
    bar = FlowProgress(f"fluid-{algorithm}-{execution}", None, f"FLUID {algorithm}/{execution}", progress,
                       unit="trials").start()  # how many trials a search makes is not known up front
    failures: list[str] = []
    errors: dict[str, str] = {}
    scores: dict[str, float] = {}
    widths_seen: dict[str, list[float]] = {}
    placements: dict[str, list[dict[str, Any]]] = {}
    total_iters = 0

    def budget(tid: str) -> int:
        return max(1, int(round(session.trial(tid).budget)))

    def submit(tid: str) -> None:
        t = session.trial(tid)
        start = done_iters[tid]
        n = min(chunk, budget(tid) - start)
        load = ckpt(tid) if start > 0 else (ckpt(t.checkpoint) if t.checkpoint else None)
        w, gpus_ = width[tid], where[tid]
        widths_seen.setdefault(tid, []).append(w)
        args = (tid, dict(t.config), int(t.resume_from) + start, n, load, ckpt(tid), w, seed)
        fail = tid == fail_trial and (start > 0 or n >= budget(tid))
        if escher is not None:
            fut = escher.submit(*args, fail=fail)
        else:
            with gpu_options(gpus=w if w < 1 else float(len(gpus_)), devices=gpus_,  # FLUID's GPUs, not best fit
                             label=f"trial {tid}"):  # names the lease on the pool's occupancy chart
                fut = train_chunk.submit(*args, fail=fail)
        inflight[fut], pinned[fut] = tid, gpus_

    def apply(step: Step) -> None:
        for p in step.starts:
            width[p.trial_id], where[p.trial_id], done_iters[p.trial_id] = p.width, p.gpus, 0
            log.open(session.trial(p.trial_id), algorithm, execution)
            submit(p.trial_id)
        for p in step.resizes:
            width[p.trial_id], where[p.trial_id] = p.width, p.gpus  # applied when its next chunk is submitted

    apply(session.start(now()))
    while inflight:
        for fut in _finished(inflight):
            tid, asked = inflight.pop(fut), pinned.pop(fut)
            try:
                out = fut.result()
            except Exception as exc:  # the trial's task failed: record it, free nothing (the runner did), go on
                failures.append(tid)
                errors[tid] = f"{type(exc).__name__}: {exc}"
                scores[tid] = 1.0
                log.close(tid, ok=False, error=errors[tid])
                out = None
            if out is not None:
                t = session.trial(tid)
                log.chunk(out, int(t.resume_from) + done_iters[tid])
                placements.setdefault(tid, []).append(
                    {"fluid_devices": list(asked),
                     **{k: out[k] for k in ("start", "width", "devices", "fraction", "data_parallel", "loss", "slice_s",
                                            "started_at", "finished_at")}})
                done_iters[tid] += out["iterations"]
                total_iters += out["iterations"]
                session.report_progress(tid, done_iters[tid])
                if done_iters[tid] < budget(tid):
                    submit(tid)
                    continue
                scores[tid] = 1.0 - out["val_accuracy"][-1]
                log.close(tid, ok=True)
            step = session.report_complete(now(), tid, scores[tid])
            for stopped in step.stops:
                inflight_ids = {v: k for k, v in inflight.items()}
                if stopped in inflight_ids:
                    done_iters[stopped] = budget(stopped)  # its running chunk is its last
            apply(step)
        bar.update(len(scores), f"failed {len(failures)}, running {len(inflight)}, iterations {total_iters}")
    makespan = now()
    bar.close()
    best = best_result(algo.results, failures)
    version = log.register(best.trial_id, load_model(best.config, ckpt(best.trial_id)), model_name)
    log.table(algorithm, [
        {"trial": r.trial_id, "config": r.config, "iterations": r.iterations,
         "val_accuracy": None if r.trial_id in failures else 1.0 - r.score, "failed": r.trial_id in failures,
         "gpu_widths": widths_seen.get(r.trial_id, []), "chunks": len(placements.get(r.trial_id, [])),
         "best": r.trial_id == best.trial_id} for r in algo.results],
        f"FLUID {execution} / {algorithm}: every trial's configuration, result and the GPU widths it was given")
    publish_pool_occupancy()
    curve, scaling = cal.curve, cal.scaling
    return {"algorithm": algorithm, "execution": execution, "c": cal.c, "d": cal.d, "alpha": cal.alpha,
            "beta": cal.beta, "c_source": cal.c_source, "d_source": cal.d_source,
            "packing_curve": None if curve is None else {"ps": list(curve.ps), "iters_per_s": list(curve.throughputs),
                                                         "alpha": curve.alpha, "c": curve.c},
            "scaling": None if scaling is None else {"widths": list(scaling.widths), "iter_s": list(scaling.iter_times),
                                                     "beta": scaling.beta},
            "makespan_s": makespan, "group_makespans_s": executor.group_makespans, "mlflow_errors": log.errors,
            "calibration_s": cal.seconds, "profiling_s": profiler.seconds, "profiles": dict(profiler.profiles),
            "trial_times": {tid: {"config": dict(session.trial(tid).config),
                                  "iter_time_s": session.trial(tid).iter_time_s,
                                  "h1_s": session.trial(tid).h1,
                                  "slice_s": sum(ch["slice_s"] for ch in placements.get(tid, []))}
                            for tid in scores},
            "trials": len(scores), "failures": failures, "errors": errors, "escher": escher and escher.report(),
            "best_trial": best.trial_id, "best_config": best.config, "best_val_accuracy": 1.0 - best.score,
            "iterations_trained": total_iters, "scores": scores, "widths": widths_seen, "placements": placements,
            "mlflow_run_id": parent,
            "trial_runs": dict(log.runs), "registered_model": model_name if version else None,
            "model_version": version}


def device_model(block: GpuPool) -> str:
    """The device model that keys the saved packing curve: trials on a simulated pool train on this machine's CPU."""
    node = discover(block.simulated, block.device_backend).nodes[0]
    return "cpu" if not node.devices or node.devices[0].simulated else node.devices[0].name


VIEW = ExperimentView(
    "FLUID: compare executions on the same search (same `algorithm`, `trials`, `seed`): `fluid` against "
    "`static_fluid` and `fifo` (one whole GPU per trial). Lower `makespan_s` (wall seconds from the first trial's "
    "start to the last one's end, the paper's makespan) at the same `best_val_accuracy` wins; each trial is a nested "
    "run.",
    metrics=("makespan_s", "best_val_accuracy", "trials_failed"), params=("execution", "algorithm", "trials",
                                                                            "placement"))


def identity(parameters: dict) -> RunIdentity:
    """Experiment ``gpuflows-fluid``; runs named by execution, algorithm and, when not the pool's, the placement:
    ``fluid-asha-<time>``, ``fluid-fifo-grid-<time>``, ``fluid-asha-escher-<time>``."""
    placement = parameters.get("placement")
    return RunIdentity("fluid", (str(parameters.get("execution", "fluid")), str(parameters.get("algorithm", "grid")),
                                 None if placement in (None, "pool") else str(placement)))


def runner_settings(parameters: dict) -> dict:
    """The flow's GPU task runner from its own parameters (``pool``, ``mode``, ``tracking``); any entry point.

    Process mode keeps as many workers per device set as FLUID may pack trials on a device
    (``trials_per_device``): with ``c = 3`` three trials sharing a device run at once, none waits for a worker.
    ESCHER placement runs that many on device i of every node, and nodes share device numbers: one set per node.
    """
    out = settings(parameters, experiment=identity(parameters).experiment)
    if parameters.get("execution") == SALUS_PACK:  # the trials' tasks are admitted into Salus lanes
        return {**out, **salus_pack_runner(out["pool"], parameters.get("mode"))}
    out["workers_per_device_set"] = trials_per_device(parameters.get("c"), device_model(out["pool"])) * (
        out["pool"].nodes if parameters.get("placement") == "escher" else 1)
    return out


@flow(name="fluid-trial-groups", flow_run_name=run_namer(identity),
      task_runner=GpuTaskRunner(configure=runner_settings))
def trial_groups(algorithm: str = "grid", trials: int = 4, iterations: int = 4, pool: GpuPool | str | None = None,
                 execution: str = "fluid", seed: int = 0, space: dict | None = None, min_iterations: int = 1,
                 generations: int = 2, c: int | None = None, d: int | None = None, alpha: float | None = None,
                 chunk: int = 2, mode: str = "process", packing_iterations: int = 300,
                 tracking: MlflowTarget | bool | str | None = None, fail_trial: str | None = None,
                 model_name: str | None = None, progress: bool = True, placement: str = "pool") -> dict:
    """Tune a torch MLP on ``load_digits`` (lr, hidden size, batch size) with FLUID-placed TrialGroups.

    Args:
        algorithm: one of grid, random, hyperband, asha, bohb, pbt (``gpu.schedulers.fluid.tuning.ALGORITHMS``).
        trials: configs to sample (random/asha/bohb) or PBT population; grid uses its grid, hyperband its brackets.
        iterations: budget per fully trained config (epochs); ``min_iterations`` the smallest rung.
        pool: GpuPool block, saved block name, or None (saved default or simulated 2 x 16 GiB).
        execution: "fluid" (StaticFluid + DynamicFluid), "static_fluid" (Algorithm 3.1 only) or "fifo" (one whole
            GPU per trial): ``gpu.schedulers.fluid.policies``, the simulator's policies; or "salus-pack": every
            trial a Salus job under PACK on the pool's first device (``tasks.fluid.salus``; c, d, alpha unused).
        space: raw search space for ``gpu.schedulers.fluid.tuning.parse_space`` (needs lr, hidden, batch_size).
        c: FLUID's packing limit (trials per GPU). None derives it from the pool device's packing curve (Eq. 3.1):
            the curve ``benchmarks/fluid_packing.py`` last saved for that device in the state folder, else one
            measured at start-up (p = 1..4 trainers of this flow's MLP x ``packing_iterations`` iterations, a task
            holding one pool device whole; a few seconds on CPU). Curve, alpha and c are logged on the parent run.
        d: FLUID's parallelism limit (GPUs per trial). None derives it from beta (Eq. 3.2), fitted to the flow's MLP
            timed at widths 1..min(GPUs, 4) on whole devices at start-up (``tasks.fluid.profiling``); beta is
            measured whenever the pool has 2+ GPUs. chunk: iterations per task (resizes apply between chunks).
            Every trial's seconds per iteration is profiled on a 1/c slice before FLUID places it (once per model
            shape), so StaticFluid weighs trials by measured runtime, not by budget.
        alpha: packing overhead FLUID assumes for a trial sharing a GPU (Eq. 3.2). None: the curve's fitted alpha
            when c is derived, else 1.5 (consistent with c = 2 by Eq. 3.1). At 1.0 DynamicFluid never moves a
            packed trial to a whole GPU.
        mode: GpuTaskRunner mode. tracking: MlflowTarget, a saved one's name, False for none, None for the default
            target.
        fail_trial: fault injection - this trial id's training raises (e.g. "c0001@0") in its second chunk (its
            first if it has only one), after it held a slice beside the others.
        model_name: registered model name (default ``trial-groups-<algorithm>``).
        placement: "pool" (each chunk pinned to the GPUs FLUID chose) or "escher" (a pool of several nodes:
            each chunk a gang of data-parallel workers on nodes an ESCHER library chose, migrating between
            chunks as EscherTune does; ``tasks.fluid.escher``).
    """
    prepare(pool, tracking, algorithm=algorithm, trials=trials, iterations=iterations, seed=seed, space=space,
            min_iterations=min_iterations, generations=generations, execution=execution, c=c, d=d, alpha=alpha,
            chunk=chunk, mode=mode, packing_iterations=packing_iterations, fail_trial=fail_trial, placement=placement)
    runner = flow_runner()  # the pool and target resolved from these parameters (or the runner given)
    block = runner.pool if runner else pool_block(pool)
    target = runner.tracking if runner else tracking_target(tracking, identity({}).experiment)
    node = discover(block.simulated, block.device_backend).nodes[0]
    device = device_model(block)
    parent = publish_mlflow_link(runner) if target.enabled else None
    log_flow_inputs(identity({"execution": execution, "algorithm": algorithm, "placement": placement}), {
        "algorithm": algorithm, "execution": execution, "trials": trials, "iterations": iterations, "seed": seed,
        "pool": block.name, "pool_gpus": len(node.devices), "c": "derived" if c is None else c,
        "d": "derived" if d is None else d,
        "alpha": "derived" if alpha is None else alpha, "chunk": chunk, "mode": mode, "placement": placement}, VIEW)
    if execution == SALUS_PACK:
        summary = pack_search(make_algorithm(algorithm, trials, iterations, seed, space, min_iterations, generations),
                              algorithm, node.devices[0], seed, fail_trial, target.resolved_uri(),
                              model_name or f"trial-groups-{algorithm}", parent)
    else:
        with escher_trials(placement, runner) as escher:
            gpus = [dev.index for dev in node.devices]
            summary = _search(algorithm, trials, iterations, seed, space, min_iterations, generations, execution,
                              gpus, device, c, d, None if alpha is None else float(alpha),
                              packing_iterations, chunk, fail_trial, target.resolved_uri(),
                              model_name or f"trial-groups-{algorithm}", progress, parent, escher)
    log_flow_outcome({"best_val_accuracy": summary["best_val_accuracy"], "trials_run": summary["trials"],
                      "trials_failed": len(summary["failures"]), "iterations_trained": summary["iterations_trained"],
                      "makespan_s": summary["makespan_s"], "profiling_s": summary["profiling_s"]})
    tracker = flow_tracker()
    summary["mlflow_errors"] += tracker.flush() if tracker else []
    return summary


def prepare(pool: GpuPool | str | None, tracking: MlflowTarget | bool | None, *, algorithm: str, trials: int,
            iterations: int, seed: int, space: dict | None, min_iterations: int, generations: int, execution: str,
            c: int | None, d: int, alpha: float | None, chunk: int, mode: str, packing_iterations: int,
            fail_trial: str | None, placement: str = "pool", **_: Any) -> tuple[GpuPool, MlflowTarget, Node]:
    """The flow's pool, MLflow target and node, every parameter checked: the flow calls it for deployment runs,
    ``main`` before the flow, so a bad argument fails before a flow run starts (the others, ``_``, need none)."""
    make_algorithm(algorithm, trials, iterations, seed, space, min_iterations, generations)
    if execution not in (*EXECUTIONS, SALUS_PACK):
        raise ConfigError("execution", execution, f"choose one of {(*EXECUTIONS, SALUS_PACK)}")
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    for name, value in (("chunk", chunk), ("packing_iterations", packing_iterations)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(name, value, "must be a whole number of iterations > 0")
        integer(value, name, maximum=MAX_COUNT)
    FluidParams(c=2 if c is None else c, d=1 if d is None else d)
    if alpha is not None:
        packing_limit(alpha)  # ConfigError naming alpha when < 1
    pattern, example = TRIAL_IDS[algorithm]
    if fail_trial is not None and not (isinstance(fail_trial, str) and re.fullmatch(pattern, fail_trial)):
        raise ConfigError("fail_trial", fail_trial, f"not a trial id of a {algorithm} search, e.g. {example}")
    if placement not in PLACEMENTS:
        raise ConfigError("placement", placement, f"choose one of {PLACEMENTS}")
    block = pool_block(pool)
    target = tracking_target(tracking, identity({}).experiment)
    node = discover(block.simulated, block.device_backend).nodes[0]
    if not node.devices:
        raise ConfigError("pool", block.name, "has no GPUs (simulated or NVML) to run trials on")
    if placement == "escher" and execution == SALUS_PACK:
        raise ConfigError("placement", placement, f"--execution {SALUS_PACK} packs every trial on one device; "
                                                  "ESCHER places FLUID's trials across nodes")
    if placement == "escher" and block.nodes < 2:
        raise ConfigError("placement", placement, f"places trials across nodes; pool {block.name!r} has 1 node "
                                                  "(give it nodes >= 2)")
    return block, target, node


def format_summary(summary: dict) -> str:
    """The search's outcome as the command line prints it."""
    if summary["execution"] == SALUS_PACK:
        lines = [f"Salus PACK on one device: up to {summary['lanes']} lanes at once"]
    else:
        lines = [f"FLUID c = {summary['c']}, d = {summary['d']}, alpha = {summary['alpha']:.3f}, "
                 f"beta = {summary['beta']:.3f} (c: {summary['c_source']}; d: {summary['d_source']})"]
    return "\n".join(lines + [
        f"makespan {summary['makespan_s']:.1f} s (profiling {summary['profiling_s']:.1f} s of it; calibration "
        f"{summary['calibration_s']:.1f} s before it)",
        f"{summary['algorithm']}/{summary['execution']}: {summary['trials']} trials, "
        f"{summary['iterations_trained']} iterations, failed {summary['failures'] or 'none'}",
        f"best {summary['best_trial']} {summary['best_config']} val_accuracy {summary['best_val_accuracy']:.3f}"
        f" (model {summary['registered_model']} v{summary['model_version']})"])


def main(argv: list[str] | None = None) -> int:
    parser = flow_parser("flows.trial_groups", __doc__)
    parser.add_argument("--algorithm", default="grid", help=f"one of {SEARCHES} (default grid: 4 configs)")
    parser.add_argument("--trials", type=int, default=4, help="configs / PBT population (default 4)")
    parser.add_argument("--iterations", type=int, default=4, help="epochs per fully trained config (default 4)")
    parser.add_argument("--min-iterations", type=int, default=1, help="smallest rung (hyperband/asha/bohb)")
    parser.add_argument("--execution", default="fluid", help=f"one of {(*EXECUTIONS, SALUS_PACK)} (default fluid)")
    parser.add_argument("--pool", default=None, help="saved GpuPool block name (default: simulated 2 x 16 GiB)")
    parser.add_argument("--mode", default="process", help=f"runner mode, one of {MODES} (default process)")
    parser.add_argument("--chunk", type=int, default=2, help="iterations per task (default 2)")
    parser.add_argument("--c", type=int, default=None,
                        help="FLUID packing limit, trials per GPU (default: from the device's packing curve)")
    parser.add_argument("--d", type=int, default=None,
                        help="FLUID parallelism limit, GPUs per trial (default: from the measured scaling, beta -> d)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="packing overhead (Eq. 3.2; default: the curve's alpha, or 1.5 with --c)")
    parser.add_argument("--packing-iterations", type=int, default=300,
                        help="iterations per trainer of the start-up packing measurement (default 300)")
    parser.add_argument("--placement", default="pool",
                        help=f"one of {PLACEMENTS}: FLUID's GPUs on one node, or ESCHER gangs across nodes "
                             "(needs --nodes >= 2; default pool)")
    parser.add_argument("--nodes", type=int, default=None,
                        help="simulated nodes of the pool (default: the pool's own, 1 for the simulated default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-trial", default=None, help="inject a failure in this trial id (e.g. c0001@0)")
    parser.add_argument("--no-tracking", action="store_true", help="switch MLflow tracking off")
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the summary as JSON")
    args = parser.parse_args(argv)
    kwargs = flow_arguments(trial_groups, algorithm=args.algorithm, trials=args.trials, iterations=args.iterations,
                            min_iterations=args.min_iterations, execution=args.execution, pool=args.pool,
                            mode=args.mode, chunk=args.chunk, c=args.c, d=args.d, alpha=args.alpha,
                            packing_iterations=args.packing_iterations, seed=args.seed, fail_trial=args.fail_trial,
                            placement=args.placement, tracking=False if args.no_tracking else None)
    if args.nodes is not None:
        try:
            kwargs["pool"] = nodes_pool(args.pool, args.nodes)
        except GpuflowsError as exc:
            return error(exc)
    return run_checked(trial_groups, prepare, kwargs, format_summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
