"""FLUID hyperparameter TrialGroups as a Prefect flow: a tuning algorithm's trials on GPU-pool slices.

The tuning algorithm (``gpu.tuning``) hands out TrialGroups, FLUID (``FluidExecutor``: StaticFluid +
DynamicFluid, thesis §3.3.3) or the FIFO baseline decides each trial's width, and the ``GpuTaskRunner`` runs
every chunk of a trial's iterations as a real torch training task at that width on the GPUs FLUID chose
(``gpu_options(gpus=width, devices=gpus)``: widths < 1 share one device). Resizes apply at the next chunk
boundary from the trial's checkpoint. Completions are read with the public Prefect future API
(``as_completed``, ``future.state``) and fed back to the session; a failed trial is recorded (score 1.0 =
accuracy 0) and the search goes on. FLUID's packing limit ``c`` (and ``alpha``) come from the device's
measured packing curve (Eq. 3.1): the one ``benchmarks/fluid_packing.py`` saved, else a short measurement at
start-up on a whole pool device. MLflow: one child run per trial under the flow's run, the best model
registered.

    python -m flows.trial_groups --algorithm grid --iterations 4
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from typing import Any

from prefect import flow
from prefect.futures import as_completed

from gpu.devices import Node, discover
from gpu.errors import ConfigError, GpuflowsError
from gpu.scenario import integer
from gpu.schedulers.fluid import FluidParams, PackingCurve, load_packing_curve, packing_curve_path, packing_limit
from gpu.schedulers.fluid_baselines import FifoExecutor
from gpu.schedulers.fluid_executor import FluidExecutor, Step
from gpu.schedulers.fluid_session import TuningSession
from gpu.state import state_dir
from gpu.tuning import ALGORITHMS, Choice, Grid, LogUniform, parse_space
from gpuflows.args import error, flow_arguments, output_file
from resource_blocks import GpuPool, MlflowTarget
from tasks.fluid_trials import load_model, packing_curve, train_chunk
from tasks.requests import gpu_options
from tasks.flow_runtime import (flow_runner, log_flow_inputs, log_flow_outcome, pool_block, publish_mlflow_link, settings,
                                tracking_target)
from tasks.runners import GpuTaskRunner
from tasks.charts import publish_pool_occupancy
from tasks.ui import FlowProgress, publish_table

SEARCHES = ("grid", "random", "hyperband", "asha", "bohb", "pbt")
EXECUTIONS = ("fluid", "fifo")
MODES = ("process", "thread")
GRID_SPACE = {"lr": Grid((0.01, 0.1)), "hidden": Grid((16, 64)), "batch_size": Choice((64,))}
RANDOM_SPACE = {"lr": LogUniform(0.003, 0.3), "hidden": Choice((16, 32, 64, 128)), "batch_size": Choice((32, 64, 128))}
TRIAL_IDS = {  # how gpu.tuning's algorithms name trials (config @ rung): a --fail-trial of another form never fails
    "grid": (r"c\d{4}@0", "c0001@0"), "random": (r"c\d{4}@0", "c0001@0"),
    "asha": (r"c\d{4}@\d+", "c0001@1"), "bohb": (r"c\d{4}@\d+", "c0001@1"),
    "hyperband": (r"c\d{4}@\d+\.\d+", "c0001@2.0"), "pbt": (r"m\d{3}@\d+", "m001@1")}
DEFAULT_ALPHA = 1.5  # with an explicit c and no alpha: consistent with c = 2 by Eq. 3.1
PACKING_MAX_P = 4  # levels of the start-up measurement (c is capped at the largest level measured)


def make_algorithm(algorithm: str, trials: int, iterations: int, seed: int, space: dict | None,
                   min_iterations: int, generations: int):
    """The tuning algorithm of ``gpu.tuning`` for this search (validated: one ConfigError naming the bad value)."""
    if algorithm not in SEARCHES:
        raise ConfigError("algorithm", algorithm, f"choose one of {SEARCHES}")
    integer(seed, "seed", minimum=0)  # numpy's generators refuse negatives
    for name, value in (("trials", trials), ("iterations", iterations), ("min_iterations", min_iterations),
                        ("generations", generations)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(name, value, "must be a whole number > 0")
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


class TrialLog:
    """A child MLflow run per trial under the flow's run (no-op when tracking is off)."""

    def __init__(self, parent: str | None, tracking_uri: str):
        self.parent, self.runs, self.client, self.exp = parent, {}, None, None
        if parent is not None:
            from mlflow import MlflowClient

            self.client = MlflowClient(tracking_uri)
            self.exp = self.client.get_run(parent).info.experiment_id
        self.tracking_uri = tracking_uri

    def open(self, trial, algorithm: str, execution: str) -> None:
        if self.client is None:
            return
        from mlflow.entities import Param

        run = self.client.create_run(self.exp, run_name=f"trial-{trial.trial_id}", tags={
            "mlflow.parentRunId": self.parent, "trial_id": trial.trial_id, "trial": trial.trial_id, "algorithm": algorithm,
            "execution": execution, "checkpoint_from": trial.checkpoint or "none"})
        params = [Param(k, str(v)) for k, v in trial.config.items()]
        params += [Param("budget", str(trial.budget)), Param("resume_from", str(trial.resume_from))]
        self.client.log_batch(run.info.run_id, params=params)
        self.runs[trial.trial_id] = run.info.run_id

    def chunk(self, out: dict[str, Any], step0: int) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric, RunTag

        rid = self.runs[out["trial_id"]]
        metrics = [Metric("width", float(out["width"]), 0, step0), Metric("gpu_fraction", out["fraction"], 0, step0),
                   Metric("data_parallel_devices", out["data_parallel"], 0, step0)]
        for i, (loss, acc) in enumerate(zip(out["loss"], out["val_accuracy"])):
            metrics += [Metric("loss", loss, 0, step0 + i + 1), Metric("val_accuracy", acc, 0, step0 + i + 1)]
        devices = ",".join(map(str, out["devices"]))
        tags = [RunTag("devices", devices), RunTag("width", f"{out['width']:.3f}"), RunTag("execution_note", out["note"]),
                RunTag(f"placement.{step0:04d}", f"node={out['node']} devices={devices} fraction={out['fraction']:g} "
                                                 f"width={out['width']:g} data_parallel={out['data_parallel']}")]
        self.client.log_batch(rid, metrics=metrics, tags=tags)

    def close(self, trial_id: str, ok: bool, error: str | None = None) -> None:
        if self.client is None:
            return
        if error:
            self.client.set_tag(self.runs[trial_id], "error", error[:500])
        self.client.set_terminated(self.runs[trial_id], "FINISHED" if ok else "FAILED")

    def register(self, trial_id: str, model, name: str) -> str | None:
        if self.client is None:
            return None
        import mlflow
        import mlflow.pytorch

        mlflow.set_tracking_uri(self.tracking_uri)
        with mlflow.start_run(run_id=self.runs[trial_id]):
            info = mlflow.pytorch.log_model(model, name="model", registered_model_name=name,
                                            serialization_format="pickle", pip_requirements=["torch==2.13.0"])
        self.client.set_terminated(self.runs[trial_id], "FINISHED")
        return str(info.registered_model_version)

    def search(self, c: int | None, d: int, alpha: float, source: str, curve: PackingCurve | None) -> None:
        """FLUID's parameters on the parent run, and the packing curve they came from (metrics by p)."""
        if self.client is None:
            return
        from mlflow.entities import Metric, Param

        params = [Param("fluid.c", str(c)), Param("fluid.d", str(d)), Param("fluid.alpha", f"{alpha:.4g}"),
                  Param("fluid.c_source", source[:500])]
        metrics = []
        if curve is not None:
            params.append(Param("packing.o_th", str(curve.o_th)))
            metrics = [Metric("packing_alpha", curve.alpha, 0, 0), Metric("packing_c", curve.c, 0, 0),
                       Metric("packing_t1_s", curve.t1, 0, 0)]
            metrics += [Metric("packing_iters_per_s", x, 0, p) for p, x in zip(curve.ps, curve.throughputs)]
            metrics += [Metric("packing_marginal_benefit", o, 0, p)
                        for p, o in zip(curve.ps[1:], curve.marginal_benefit)]
        self.client.log_batch(self.parent, metrics=metrics, params=params)


def _finished(inflight: dict) -> list:
    """Wait for a chunk to finish, then every finished chunk in submission order.

    FIFO among finished chunks keeps a fast event (a failure freeing its slice) from waiting behind busy
    neighbours, so DynamicFluid sees it while they still have iterations to resize.
    Only public future API (``as_completed``, ``state.is_final()``), so any Prefect task runner's futures work.
    """
    first = next(as_completed(list(inflight)))
    return [f for f in inflight if f is first or f.state.is_final()]


def _packing_curve(device: str, gpu: int, iterations: int) -> tuple[PackingCurve, str]:
    """The device's saved packing curve (``benchmarks/fluid_packing.py``), else a short one measured now.

    The measurement runs as a task holding pool device ``gpu`` whole, so it sees that device alone (on a
    simulated pool: this machine's CPU, where the trials will run too).
    """
    saved = load_packing_curve(device)
    if saved is not None:
        return saved, f"saved curve {packing_curve_path(device)}"
    with gpu_options(gpus=1.0, devices=(gpu,)):
        measured = packing_curve.submit(iterations, PACKING_MAX_P).result()
    return measured, f"measured at start on {device} (device {gpu}, p = 1..{PACKING_MAX_P} x {iterations} iterations)"


def _search(algorithm: str, trials: int, iterations: int, seed: int, space: dict | None, min_iterations: int,
            generations: int, execution: str, gpus: list[int], device: str, c: int | None, d: int,
            alpha: float | None, packing_iterations: int, chunk: int, fail_trial: str | None, tracking_uri: str,
            model_name: str, progress: bool, parent: str | None) -> dict:
    """The search itself, in the flow run (its chunks on the flow's GPU task runner); ``parent``: its MLflow run."""
    algo = make_algorithm(algorithm, trials, iterations, seed, space, min_iterations, generations)
    log = TrialLog(parent, tracking_uri)
    curve, source = None, "given"
    if c is None and execution == "fluid":
        curve, source = _packing_curve(device, gpus[0], packing_iterations)
        c, alpha = curve.c, curve.alpha if alpha is None else alpha
    elif c is None:
        source = "fifo: one trial per GPU, no packing"
    alpha = DEFAULT_ALPHA if alpha is None else alpha
    log.search(c, d, alpha, source, curve)
    executor = (FluidExecutor(gpus, FluidParams(c=c, d=d), dynamic=True) if execution == "fluid"
                else FifoExecutor(gpus))
    session = TuningSession(algo, executor, profile=lambda t: replace(t, alpha=alpha))
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
        with gpu_options(gpus=w if w < 1 else float(len(gpus_)), devices=gpus_,  # FLUID's GPUs, not best fit
                         label=f"trial {tid}"):  # names the lease on the pool's occupancy chart
            fut = train_chunk.submit(tid, dict(t.config), int(t.resume_from) + start, n, load, ckpt(tid), w, seed,
                                     fail=tid == fail_trial and (start > 0 or n >= budget(tid)))
        inflight[fut], pinned[fut] = tid, gpus_

    def apply(step: Step) -> None:
        for p in step.starts:
            width[p.trial_id], where[p.trial_id], done_iters[p.trial_id] = p.width, p.gpus, 0
            log.open(session.trial(p.trial_id), algorithm, execution)
            submit(p.trial_id)
        for p in step.resizes:
            width[p.trial_id], where[p.trial_id] = p.width, p.gpus  # applied when its next chunk is submitted

    apply(session.start())
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
                     **{k: out[k] for k in ("start", "width", "devices", "fraction", "data_parallel", "loss")}})
                done_iters[tid] += out["iterations"]
                total_iters += out["iterations"]
                session.report_progress(tid, done_iters[tid])
                if done_iters[tid] < budget(tid):
                    submit(tid)
                    continue
                scores[tid] = 1.0 - out["val_accuracy"][-1]
                log.close(tid, ok=True)
            step = session.report_complete(tid, scores[tid])
            for stopped in step.stops:
                inflight_ids = {v: k for k, v in inflight.items()}
                if stopped in inflight_ids:
                    done_iters[stopped] = budget(stopped)  # its running chunk is its last
            apply(step)
        bar.update(len(scores), f"failed {len(failures)}, running {len(inflight)}, iterations {total_iters}")
    bar.close()
    ok = [r for r in algo.results if r.trial_id not in failures]
    if not ok:
        raise RuntimeError(f"every trial failed: {failures}")
    top = max(r.iterations for r in ok)
    best = min((r for r in ok if r.iterations == top), key=lambda r: r.score)
    version = log.register(best.trial_id, load_model(best.config, ckpt(best.trial_id)), model_name)
    publish_table(f"fluid-trials-{algorithm}", [
        {"trial": r.trial_id, "config": r.config, "iterations": r.iterations,
         "val_accuracy": None if r.trial_id in failures else 1.0 - r.score, "failed": r.trial_id in failures,
         "gpu_widths": widths_seen.get(r.trial_id, []), "chunks": len(placements.get(r.trial_id, [])),
         "best": r.trial_id == best.trial_id} for r in algo.results],
        f"FLUID {execution} / {algorithm}: every trial's configuration, result and the GPU widths it was given")
    publish_pool_occupancy()
    return {"algorithm": algorithm, "execution": execution, "c": c, "d": d, "alpha": alpha, "c_source": source,
            "packing_curve": None if curve is None else {"ps": list(curve.ps), "iters_per_s": list(curve.throughputs),
                                                         "alpha": curve.alpha, "c": curve.c},
            "trials": len(scores), "failures": failures, "errors": errors,
            "best_trial": best.trial_id, "best_config": best.config, "best_val_accuracy": 1.0 - best.score,
            "iterations_trained": total_iters, "scores": scores, "widths": widths_seen, "placements": placements,
            "mlflow_run_id": parent,
            "trial_runs": dict(log.runs), "registered_model": model_name if version else None,
            "model_version": version}


def runner_settings(parameters: dict) -> dict:
    """The flow's GPU task runner from its own parameters (``pool``, ``mode``, ``tracking``); any entry point."""
    return settings(parameters, experiment="gpuflows-fluid")


@flow(name="fluid-trial-groups", task_runner=GpuTaskRunner(configure=runner_settings))
def trial_groups(algorithm: str = "grid", trials: int = 4, iterations: int = 4, pool: GpuPool | str | None = None,
                 execution: str = "fluid", seed: int = 0, space: dict | None = None, min_iterations: int = 1,
                 generations: int = 2, c: int | None = None, d: int = 1, alpha: float | None = None,
                 chunk: int = 2, mode: str = "process", packing_iterations: int = 300,
                 tracking: MlflowTarget | bool | str | None = None, fail_trial: str | None = None,
                 model_name: str | None = None, progress: bool = True) -> dict:
    """Tune a torch MLP on ``load_digits`` (lr, hidden size, batch size) with FLUID-placed TrialGroups.

    Args:
        algorithm: one of grid, random, hyperband, asha, bohb, pbt (``gpu.tuning.ALGORITHMS``).
        trials: configs to sample (random/asha/bohb) or PBT population; grid uses its grid, hyperband its brackets.
        iterations: budget per fully trained config (epochs); ``min_iterations`` the smallest rung.
        pool: GpuPool block, saved block name, or None (saved default or simulated 2 x 16 GiB).
        execution: "fluid" (StaticFluid + DynamicFluid) or "fifo" (one whole GPU per trial).
        space: raw search space for ``gpu.tuning.parse_space`` (needs lr, hidden, batch_size).
        c: FLUID's packing limit (trials per GPU). None derives it from the pool device's packing curve (Eq. 3.1):
            the curve ``benchmarks/fluid_packing.py`` last saved for that device in the state folder, else one
            measured at start-up (p = 1..4 trainers of this flow's MLP x ``packing_iterations`` iterations, a task
            holding one pool device whole; a few seconds on CPU). Curve, alpha and c are logged on the parent run.
        d: FLUID's parallelism limit (GPUs per trial). chunk: iterations per task (resizes apply between chunks).
        alpha: packing overhead FLUID assumes for a trial sharing a GPU (Eq. 3.2). None: the curve's fitted alpha
            when c is derived, else 1.5 (consistent with c = 2 by Eq. 3.1). At 1.0 DynamicFluid never moves a
            packed trial to a whole GPU.
        mode: GpuTaskRunner mode. tracking: MlflowTarget, a saved one's name, False for none, None for the default
            target.
        fail_trial: fault injection - this trial id's training raises (e.g. "c0001@0") in its second chunk (its
            first if it has only one), after it held a slice beside the others.
        model_name: registered model name (default ``trial-groups-<algorithm>``).
    """
    prepare(pool, tracking, algorithm=algorithm, trials=trials, iterations=iterations, seed=seed, space=space,
            min_iterations=min_iterations, generations=generations, execution=execution, c=c, d=d, alpha=alpha,
            chunk=chunk, mode=mode, packing_iterations=packing_iterations, fail_trial=fail_trial)
    runner = flow_runner()  # the pool and target resolved from these parameters (or the runner given)
    block = runner.pool if runner else pool_block(pool)
    target = runner.tracking if runner else tracking_target(tracking)
    node = discover(block.simulated, block.device_backend).nodes[0]
    # the device model keys the saved packing curve: trials on a simulated pool train on this machine's CPU
    device = "cpu" if node.devices[0].simulated else node.devices[0].name
    parent = publish_mlflow_link(runner) if target.enabled else None
    log_flow_inputs("fluid", f"{execution}-{algorithm}", {
        "algorithm": algorithm, "execution": execution, "trials": trials, "iterations": iterations, "seed": seed,
        "pool": block.name, "pool_gpus": len(node.devices), "c": "derived" if c is None else c, "d": d,
        "alpha": "derived" if alpha is None else alpha, "chunk": chunk, "mode": mode})
    summary = _search(algorithm, trials, iterations, seed, space, min_iterations, generations, execution,
                      [dev.index for dev in node.devices], device, c, d, None if alpha is None else float(alpha),
                      packing_iterations, chunk, fail_trial, target.resolved_uri(),
                      model_name or f"trial-groups-{algorithm}", progress, parent)
    log_flow_outcome({"best_val_accuracy": summary["best_val_accuracy"], "trials_run": summary["trials"],
                      "trials_failed": len(summary["failures"]), "iterations_trained": summary["iterations_trained"]})
    return summary


def prepare(pool: GpuPool | str | None, tracking: MlflowTarget | bool | None, *, algorithm: str, trials: int,
            iterations: int, seed: int, space: dict | None, min_iterations: int, generations: int, execution: str,
            c: int | None, d: int, alpha: float | None, chunk: int, mode: str, packing_iterations: int,
            fail_trial: str | None, **_: Any) -> tuple[GpuPool, MlflowTarget, Node]:
    """The flow's pool, MLflow target and node, every parameter checked: the flow calls it for deployment runs,
    ``main`` before the flow, so a bad argument fails before a flow run starts (the others, ``_``, need none)."""
    make_algorithm(algorithm, trials, iterations, seed, space, min_iterations, generations)
    if execution not in EXECUTIONS:
        raise ConfigError("execution", execution, f"choose one of {EXECUTIONS}")
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise ConfigError("chunk", chunk, "must be a whole number of iterations > 0")
    if isinstance(packing_iterations, bool) or not isinstance(packing_iterations, int) or packing_iterations <= 0:
        raise ConfigError("packing_iterations", packing_iterations, "must be a whole number of iterations > 0")
    FluidParams(c=2 if c is None else c, d=d)
    if alpha is not None:
        packing_limit(alpha)  # ConfigError naming alpha when < 1
    pattern, example = TRIAL_IDS[algorithm]
    if fail_trial is not None and not (isinstance(fail_trial, str) and re.fullmatch(pattern, fail_trial)):
        raise ConfigError("fail_trial", fail_trial, f"not a trial id of a {algorithm} search, e.g. {example}")
    block, target = pool_block(pool), tracking_target(tracking)
    node = discover(block.simulated, block.device_backend).nodes[0]
    if not node.devices:
        raise ConfigError("pool", block.name, "has no GPUs (simulated or NVML) to run trials on")
    return block, target, node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.trial_groups", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="grid", help=f"one of {SEARCHES} (default grid: 4 configs)")
    parser.add_argument("--trials", type=int, default=4, help="configs / PBT population (default 4)")
    parser.add_argument("--iterations", type=int, default=4, help="epochs per fully trained config (default 4)")
    parser.add_argument("--min-iterations", type=int, default=1, help="smallest rung (hyperband/asha/bohb)")
    parser.add_argument("--execution", default="fluid", help=f"one of {EXECUTIONS} (default fluid)")
    parser.add_argument("--pool", default=None, help="saved GpuPool block name (default: simulated 2 x 16 GiB)")
    parser.add_argument("--mode", default="process", help=f"runner mode, one of {MODES} (default process)")
    parser.add_argument("--chunk", type=int, default=2, help="iterations per task (default 2)")
    parser.add_argument("--c", type=int, default=None,
                        help="FLUID packing limit, trials per GPU (default: from the device's packing curve)")
    parser.add_argument("--d", type=int, default=1, help="FLUID parallelism limit, GPUs per trial (default 1)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="packing overhead (Eq. 3.2; default: the curve's alpha, or 1.5 with --c)")
    parser.add_argument("--packing-iterations", type=int, default=300,
                        help="iterations per trainer of the start-up packing measurement (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-trial", default=None, help="inject a failure in this trial id (e.g. c0001@0)")
    parser.add_argument("--no-tracking", action="store_true", help="switch MLflow tracking off")
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the summary as JSON")
    args = parser.parse_args(argv)
    kwargs = flow_arguments(trial_groups, algorithm=args.algorithm, trials=args.trials, iterations=args.iterations,
                            min_iterations=args.min_iterations, execution=args.execution, pool=args.pool,
                            mode=args.mode, chunk=args.chunk, c=args.c, d=args.d, alpha=args.alpha,
                            packing_iterations=args.packing_iterations, seed=args.seed, fail_trial=args.fail_trial,
                            tracking=False if args.no_tracking else None)
    try:
        kwargs["pool"], kwargs["tracking"], _ = prepare(**kwargs)  # every argument checked before the run starts
        summary = trial_groups(**kwargs)
    except GpuflowsError as exc:
        return error(exc)
    print(f"FLUID c = {summary['c']}, d = {summary['d']}, alpha = {summary['alpha']:.3f} ({summary['c_source']})")
    print(f"{summary['algorithm']}/{summary['execution']}: {summary['trials']} trials, "
          f"{summary['iterations_trained']} iterations, failed {summary['failures'] or 'none'}")
    print(f"best {summary['best_trial']} {summary['best_config']} val_accuracy {summary['best_val_accuracy']:.3f}"
          f" (model {summary['registered_model']} v{summary['model_version']})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
