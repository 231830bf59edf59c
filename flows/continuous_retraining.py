"""Ekya continuous retraining as a Prefect flow: drifting streams share a GPU pool for retraining and
inference; an Ekya policy (the thief scheduler or a baseline, thesis §2.4, §2.6) splits it.

Per retraining window (thesis §2.4):

1. micro-profiling tasks: the golden model labels a sample of each stream's frames, every
   (layers, data fraction) pair is trained for a few epochs with its epoch cost measured on the task's
   slice, the deployed model is timed per frame; ``micro_profile`` extrapolates each config's accuracy
   and GPU-seconds; every 2 windows the worst configs are pruned (policies that choose configs);
2. the decision: ``EkyaController.on_window_start`` runs the policy (``policy``: any name of
   ``gpu.schedulers.ekya.policies`` - ``thief``, ``thief_start_splits``, ``noretrain``, ``fixedres``,
   ``uniform_<cfg>_<pct>``, ``fixedconfig_<cfg>`` - or ``uniform``, short for
   ``uniform_<uniform_config>_<100 x uniform_share>``);
3. retraining tasks on the decided GPU share (``gpu_options(gpus=...)``); each one's measured duration
   on its slice says when it deploys; ``EkyaController.on_job_done`` then returns its GPUs to its
   stream's inference and re-invokes the thief (and FixedConfig) for the rest of the window;
4. inference tasks serve the live frames of each period between two such events at the frame rate
   the stream's inference share sustains, measured on that share (``tasks.ekya.work.infer_segment``);
   measured accuracy = share of frames answered correctly against the true labels.

Time inside a window is slice time (``window_s`` slice seconds; ``tasks.ekya.window``): the measured
work divided by the share it ran on, so decisions follow the real torch work (make a stream's work
heavier and its jobs take longer) but not how loaded this machine happens to be. The simulator
(``gpuflows simulate ekya``) drives the same controller with modelled outcomes. A retraining that fails
or is cancelled is handled when the flow sees it: its stream keeps serving the previous model, its GPUs
go back to inference, the window's MLflow run records it, and the next window proceeds. One MLflow run
per window (nested under the flow's run) records allocations, configs, predicted and measured accuracy
and durations; each retrained model is a version of the registered model ``<prefix>-<stream>``.

``executor``: ``slices`` (each job a task on its own fraction) or ``salus``: each device's retraining and
inference jobs are co-located Salus jobs in one lane under weighted FAIR, Ekya's split as the weights
(``tasks.ekya.salus``); the window's MLflow run adds the lanes, admission waits and realised vs decided shares.

    python -m flows.continuous_retraining --streams 2 --windows 2 --policy thief [--executor salus]
"""

from __future__ import annotations

import sys

from prefect import flow, get_run_logger

from gpu.devices import discover
from gpu.errors import ConfigError, GpuflowsError
from gpu.scenario import MAX_GPUS, MAX_SEED, fraction, integer, positive
from gpu.schedulers.ekya.thief import EkyaParams
from gpu.schedulers.ekya.policies import make_policy, policy_names
from gpuflows.args import add_runner_arguments, error, flow_arguments, flow_parser, output_file, run_checked
from resource_blocks import GpuPool, MlflowTarget
from tasks.ekya.records import WindowLogger
from tasks.ekya.salus import EXECUTORS, JOBS_PER_DEVICE
from tasks.ekya.work import WindowSettings, config_grid
from tasks.ekya.window import RunSettings, WindowResult, make_controller, run_window, start_streams
from tasks.runtime.flow import (RunIdentity, flow_runner, log_flow_inputs, log_flow_outcome, pool_block,
                                publish_mlflow_link, run_namer, settings, tracking_target)
from tasks.runtime.runners import GpuTaskRunner
from tasks.runtime.tracking import ExperimentView, flow_tracker
from tasks.report.occupancy import publish_pool_occupancy
from tasks.report.progress import FlowProgress

MODES = ("process", "thread")
MAX_STREAMS = 1_000  # drifting streams: a retraining and an inference job each, every window
MAX_WINDOWS = 10_000
MAX_WINDOW_S = 24 * 3_600.0  # slice seconds of one window
MAX_OBJECTS = 10_000  # objects per frame of a stream


VIEW = ExperimentView(
    "Ekya: compare policies on the same streams (same `streams`, `windows`, `seed`), e.g. `thief` against `uniform`"
    " (`make demo` runs that pair). Higher `mean_accuracy` wins: inference accuracy measured against the true labels,"
    " the mean over windows and streams; `windows_failed` counts windows with a failed retraining.",
    metrics=("mean_accuracy", "windows_failed"), params=("policy", "executor", "streams", "windows", "seed"))


def identity(parameters: dict) -> RunIdentity:
    """Experiment ``gpuflows-ekya``; runs named by policy and, when not the default slices, the executor:
    ``ekya-thief-<time>``, ``ekya-uniform-salus-<time>``."""
    executor = parameters.get("executor")
    return RunIdentity("ekya", (str(parameters.get("policy", "thief")), None if executor in (None, "slices") else
                                str(executor)))


def runner_settings(parameters: dict) -> dict:
    """The flow's GPU task runner from its own parameters (``pool``, ``mode``, ``tracking``); any entry point.
    With ``executor="salus"`` process mode keeps a worker per co-located job a device may hold, so no admitted
    job waits for a process."""
    experiment = identity(parameters).experiment
    if parameters.get("executor") == "salus":
        return settings(parameters, experiment=experiment, workers_per_device_set=JOBS_PER_DEVICE)
    return settings(parameters, experiment=experiment)


def policy_slug(policy: str) -> str:
    """``policy`` as Prefect artifact keys allow it (lowercase letters, digits, dashes)."""
    return policy.lower().replace("_", "-").replace(".", "-")


def _windows(run: RunSettings, parent: str | None) -> dict:
    """The windows themselves, in the flow run (its tasks on the flow's GPU task runner)."""
    logger = WindowLogger(run, parent)
    controller = make_controller(run)
    golden, streams = start_streams(run, controller)
    results: list[WindowResult] = []
    errors: list[str] = []
    slug = policy_slug(run.policy)
    with FlowProgress(f"ekya-{slug}", run.windows, f"Ekya {run.policy}", unit="windows") as progress:
        for w in range(run.windows):
            result = run_window(run, w, streams, golden, controller)
            try:  # a tracking store that fails costs the review, not the retraining
                run_id = logger.log_window(result, streams)
                if result.lanes is not None:
                    logger.log_lanes(run_id, result.lanes, w)
            except Exception as exc:
                errors.append(f"window {w} not logged to MLflow: {exc!r}")
                get_run_logger().error(errors[-1])
            results.append(result)
            # the run's mean so far, as MLflow's mean_accuracy reads at the end (not the last window's alone)
            mean = sum(r.mean_measured for r in results) / len(results)
            progress.advance(note=f"mean accuracy {mean:.3f} (window {w}: {result.mean_measured:.3f})")
    plot = logger.log_plot(results)
    logger.publish_windows(slug, results)
    publish_pool_occupancy()
    summary = summarise(run, results, plot, logger.parent_run_id)
    tracker = flow_tracker()
    summary["mlflow_errors"] = errors + (tracker.flush() if tracker else [])
    return summary


def _retrainings(r: WindowResult) -> dict[str, dict]:
    """Per stream, the window's retraining job: config, GPUs, predicted vs measured duration (slice s)."""
    return {j.stream: {"config": j.config.name, "gpus": j.gpus, "state": j.outcome, "start_s": j.start,
                       "predicted_s": j.expected_s, "measured_s": j.measured_s,
                       "predicted_accuracy": j.predicted.accuracy,
                       "measured_accuracy": j.result.val_accuracy if j.result else None} for j in r.jobs}


def summarise(run: RunSettings, results: list[WindowResult], plot: str | None, parent: str | None) -> dict:
    """What the flow returns: per window and stream the decision, the measured accuracy, and the means."""
    windows = [{"window": r.window, "accuracy": r.measured, "predicted": r.predicted, "configs": r.configs,
                "allocation": r.start_alloc, "retrainings": _retrainings(r),
                "profiled_gpu_s": {s: {c: p.gpu_seconds for c, p in cfgs.items()} for s, cfgs in r.predicted_configs.items()},
                "failures": r.failures, "mean": r.mean_measured,
                **({"salus": r.lanes.summary()} if r.lanes is not None else {})} for r in results]
    return {"policy": run.policy, "scheduler": run.scheduler, "executor": run.executor, "streams": list(results[0].measured) if results else [],
            "windows": windows, "mean_accuracy": sum(r.mean_measured for r in results) / len(results),
            "mlflow_run_id": parent, "plot": plot}


def scheduler_name(policy: str, uniform_config: str, uniform_share: float) -> str:
    """The Ekya policy ``policy`` names: ``uniform`` is short for ``uniform_<uniform_config>_<pct>``."""
    if policy == "uniform":
        return f"uniform_{uniform_config}_{round(100 * uniform_share)}"
    return policy


def _check(streams: int, windows: int, window_s: float, policy: str, mode: str, seed: int, fail_stream: str | None,
           fail_window: int, uniform_config: str, uniform_share: float, profile_gpus: float, a_min: float,
           delta: float, objects_per_frame: dict[str, int] | None, executor: str) -> None:
    for name, value, top in (("streams", streams, MAX_STREAMS), ("windows", windows, MAX_WINDOWS)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(name, value, "must be a whole number > 0")
        integer(value, name, maximum=top)
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not window_s > 0:
        raise ConfigError("window_s", window_s, "must be a number of slice seconds > 0")
    positive(window_s, "window_s", upper=MAX_WINDOW_S)
    grid = config_grid()
    if uniform_config not in [c.name for c in grid]:
        raise ConfigError("uniform_config", uniform_config, f"choose one of {[c.name for c in grid]}")
    fraction(uniform_share, "uniform_share")
    if not isinstance(policy, str) or not policy:
        raise ConfigError("policy", policy, f"choose uniform or one of {list(policy_names(grid))}")
    make_policy(scheduler_name(policy, uniform_config, uniform_share), grid)  # ConfigError('policy') if unknown
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    if executor not in EXECUTORS:
        raise ConfigError("executor", executor, f"choose one of {EXECUTORS}")
    integer(seed, "seed", minimum=0, maximum=MAX_SEED)  # numpy's generators refuse negatives
    names = [f"cam{i}" for i in range(streams)]
    if fail_stream is not None and fail_stream not in names:
        raise ConfigError("fail_stream", fail_stream, f"not one of the streams {names}")
    if isinstance(fail_window, bool) or not isinstance(fail_window, int) or not 0 <= fail_window < windows:
        raise ConfigError("fail_window", fail_window, f"not one of the windows 0..{windows - 1}")
    if objects_per_frame is not None and not isinstance(objects_per_frame, dict):
        raise ConfigError("objects_per_frame", objects_per_frame, "must map stream names to whole numbers >= 1")
    for stream, k in (objects_per_frame or {}).items():
        if stream not in names:
            raise ConfigError("objects_per_frame", objects_per_frame, f"{stream!r} is not one of the streams {names}")
        integer(k, f"objects_per_frame[{stream}]", minimum=1, maximum=MAX_OBJECTS)
    positive(profile_gpus, "profile_gpus", upper=MAX_GPUS)
    positive(delta, "delta", upper=MAX_GPUS)
    EkyaParams(delta=delta, a_min=a_min)  # checks them as the thief will read them


def prepare(pool: GpuPool | str | None, tracking: MlflowTarget | bool | None, *, streams: int, windows: int,
            window_s: float, policy: str, seed: int, mode: str, a_min: float, delta: float,
            frames: int, labelled: int, uniform_config: str, uniform_share: float, profile_gpus: float,
            fail_stream: str | None, fail_window: int, registry_prefix: str,
            objects_per_frame: dict[str, int] | None = None,
            executor: str = "slices") -> tuple[GpuPool, MlflowTarget, RunSettings]:
    """The flow's pool, MLflow target and settings, every parameter checked: the flow calls it for deployment runs,
    ``main`` before the flow, so a bad argument fails before a flow run starts."""
    _check(streams, windows, window_s, policy, mode, seed, fail_stream, fail_window, uniform_config, uniform_share,
           profile_gpus, a_min, delta, objects_per_frame, executor)
    runner = flow_runner()  # in the flow run: the pool and target its runner resolved from these parameters
    block = runner.pool if runner else pool_block(pool)
    target = runner.tracking if runner else tracking_target(tracking, identity({"policy": policy,
                                                                                "executor": executor}).experiment)
    pool_spec = discover(block.simulated, block.device_backend)
    gpus = pool_spec.gpu_count
    if gpus == 0:
        raise ConfigError("pool", block.name, "has no GPUs (simulated or NVML) to split between retraining and "
                                              "inference")
    settings = WindowSettings(frames=frames, labelled=labelled, golden_seed=seed)
    run = RunSettings(policy=policy, scheduler=scheduler_name(policy, uniform_config, uniform_share), streams=streams,
                      windows=windows, window_s=float(window_s), seed=seed, pool_gpus=gpus, a_min=a_min, delta=delta,
                      profile_gpus=profile_gpus, objects_per_frame=dict(objects_per_frame or {}),
                      fail_stream=fail_stream, fail_window=fail_window, registry_prefix=registry_prefix,
                      settings=settings, experiment=target.resolved_experiment(), tracking_uri=target.resolved_uri(),
                      executor=executor,
                      device_mb=tuple(d.memory_total / 2 ** 20 for n in pool_spec.nodes for d in n.devices))
    return block, target, run


@flow(name="ekya-continuous-retraining", flow_run_name=run_namer(identity),
      task_runner=GpuTaskRunner(configure=runner_settings))
def continuous_retraining(streams: int = 4, windows: int = 3, window_s: float = 1.0, policy: str = "thief",
                          pool: GpuPool | str | None = None, seed: int = 0, mode: str = "process",
                          tracking: MlflowTarget | bool | str | None = None, a_min: float = 0.3, delta: float = 0.1,
                          frames: int = 1000, labelled: int = 1000,
                          uniform_config: str = "e5-all-d50", uniform_share: float = 0.5,
                          profile_gpus: float = 0.25, fail_stream: str | None = None, fail_window: int = 0,
                          registry_prefix: str = "ekya", objects_per_frame: dict[str, int] | None = None,
                          executor: str = "slices") -> dict:
    """Ekya continuous retraining of ``streams`` drifting digit streams over ``windows`` windows.

    Args:
        streams, windows, window_s: problem size; ``window_s`` is slice seconds per window (measured torch
            work divided by the share it ran on; see ``tasks.ekya.window``).
        policy: an Ekya policy name (``gpu.schedulers.ekya.policies``: thief, thief_start_splits, noretrain,
            fixedres, uniform_<cfg>_<pct>, fixedconfig_<cfg> with <cfg> from ``tasks.ekya.work.config_grid``)
            or "uniform" (fixed ``uniform_config``, ``uniform_share`` to inference).
        pool: GpuPool block, the name of a saved one, or None (saved default or simulated 2 x 16 GiB).
        seed: drift, golden model and training seeds.
        mode: GpuTaskRunner mode ("process": one worker process per device set; "thread").
        tracking: MlflowTarget block, the name of a saved one, False to switch MLflow off, None for the default target.
        a_min, delta: thief's minimum instantaneous accuracy and steal quantum (GPUs).
        frames, labelled: live frames per window, frames per window the golden model labels.
        profile_gpus: GPU share of each micro-profiling task.
        fail_stream, fail_window: fault injection - that stream's retraining raises in that window.
        registry_prefix: registered models are named ``<registry_prefix>-<stream>``.
        objects_per_frame: stream -> training samples each of its labelled frames yields (default 1): a busy
            camera's retraining does that many times the torch work per epoch, with the same configs.
        executor: "slices" (each job a task on its GPU fraction) or "salus" (each device's jobs co-located in one
            Salus lane under weighted FAIR, Ekya's split as the weights; ``tasks.ekya.salus``).

    Returns:
        ``{"policy", "streams", "windows": [{"window", "accuracy": {stream: measured}, "predicted",
        "configs", "failures", "mean"}], "mean_accuracy", "mlflow_run_id", "plot", "mlflow_errors"}``
        (``mlflow_errors``: what could not be logged to MLflow; empty when everything was).
    """
    block, _, run = prepare(
        pool, tracking, streams=streams, windows=windows, window_s=window_s, policy=policy, seed=seed, mode=mode,
        a_min=a_min, delta=delta, frames=frames, labelled=labelled,
        uniform_config=uniform_config, uniform_share=uniform_share, profile_gpus=profile_gpus,
        objects_per_frame=objects_per_frame, executor=executor,
        fail_stream=fail_stream, fail_window=fail_window, registry_prefix=registry_prefix)
    parent = publish_mlflow_link(flow_runner())
    log_flow_inputs(identity({"policy": policy, "executor": executor}), {
        "policy": policy, "streams": streams, "windows": windows, "window_s": window_s, "seed": seed,
        "pool": block.name, "pool_gpus": run.pool_gpus, "mode": mode or "", "frames": frames, "labelled": labelled,
        "scheduler": run.scheduler, "executor": executor}, VIEW)
    summary = _windows(run, parent)
    log_flow_outcome({"mean_accuracy": summary["mean_accuracy"],
                      "windows_failed": sum(bool(w["failures"]) for w in summary["windows"])})
    return summary


def format_summary(summary: dict) -> str:
    """A per-window, per-stream table of measured accuracy."""
    names = summary["streams"]
    lines = [f"policy={summary['policy']}  " + "  ".join(f"{n:>6s}" for n in names) + "    mean"]
    for w in summary["windows"]:
        cells = "  ".join(f"{w['accuracy'][n]:6.3f}" for n in names)
        failed = f"  failed: {','.join(w['failures'])}" if w["failures"] else ""
        lines.append(f"window {w['window']:<8d}" + " " * max(0, len(summary['policy']) - 2) + cells
                     + f"  {w['mean']:6.3f}{failed}")
    lines.append(f"mean accuracy over windows: {summary['mean_accuracy']:.3f}")
    for w in summary["windows"]:  # --executor salus: what each device's lane gave its jobs
        for span in w.get("salus", {}).get("shares", []):
            shares = ", ".join(f"{job} {span['decided'][job]:.2f}->{span['realised'][job]:.2f}" for job in span["decided"])
            lines.append(f"window {w['window']} gpu{span['device']} lane, decided->realised share: {shares}")
    return "\n".join(lines)


def _stream_counts(pairs: list[str]) -> dict[str, int]:
    """``["cam1=8"]`` -> ``{"cam1": 8}`` (the flow checks the names and counts)."""
    out: dict[str, int] = {}
    for pair in pairs:
        stream, _, count = pair.partition("=")
        try:
            out[stream] = int(count)
        except ValueError:
            raise ConfigError("objects_per_frame", pair, "must be STREAM=K with a whole number K") from None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = flow_parser("flows.continuous_retraining", __doc__)
    parser.add_argument("--streams", type=int, default=2, help="number of streams (default 2)")
    parser.add_argument("--windows", type=int, default=2, help="retraining windows (default 2)")
    parser.add_argument("--window-s", type=float, default=1.0, help="slice seconds per window (default 1)")
    parser.add_argument("--policy", default="thief", help="uniform or an Ekya policy: "
                        f"{', '.join(policy_names(config_grid())[:4])}, uniform_<cfg>_<pct>, fixedconfig_<cfg> "
                        "(default thief)")
    add_runner_arguments(parser, MODES, pool=None, simulated_devices="2x16GiB")
    parser.add_argument("--executor", default="slices", help=f"how a device's jobs share it, one of {EXECUTORS}: "
                        "slices (each its GPU fraction) or salus (one Salus lane, weighted FAIR; default slices)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-stream", default=None, help="inject a retraining failure in this stream (e.g. cam1)")
    parser.add_argument("--fail-window", type=int, default=0, help="window of the injected failure (default 0)")
    parser.add_argument("--objects-per-frame", action="append", default=[], metavar="STREAM=K",
                        help="a busy camera: STREAM's labelled frames yield K training samples each (repeatable)")
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the summary as JSON")
    args = parser.parse_args(argv)
    try:
        objects_per_frame = _stream_counts(args.objects_per_frame) or None
    except GpuflowsError as exc:
        return error(exc)
    kwargs = flow_arguments(
        continuous_retraining, streams=args.streams, windows=args.windows, window_s=args.window_s,
        policy=args.policy, pool=args.pool or GpuPool(name="ekya", simulated=args.simulated).on_this_machine(),
        seed=args.seed, mode=args.mode, executor=args.executor, tracking=False if args.no_tracking else None,
        fail_stream=args.fail_stream, fail_window=args.fail_window, objects_per_frame=objects_per_frame)
    return run_checked(continuous_retraining, prepare, kwargs, format_summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
