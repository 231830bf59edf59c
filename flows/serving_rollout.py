"""Nexus serving rollout: profile our torch models, plan with squishy bin packing, serve, re-plan each epoch.

Steps (Nexus, Shen et al. SOSP'19 §5–§6): (1) profile every model of the spec like the Nexus
profiler, one placed task per model on a GPU slice of the pool (``GpuTaskRunner``); (2) split query SLOs
(§6.2 DP) and plan with squishy bin packing (Algorithm 1); (3) roll the plan out — one worker thread per
GPU node holding a lease for its duty share on the same pool ledger (``tasks/serving/runtime.py`` says why
leases and not tasks); (4) drive the spec's rate trace with Poisson arrivals through the frontend; every
beacon the measured rates go to the Nexus controller's ``on_epoch`` (``gpu.schedulers.nexus.controller``, the
one the simulator drives; it also routes and chains the query stages), whose new plans are rolled out
incrementally; (5) log each epoch (plan, GPUs, throughput, SLO attainment, bad rate) as a nested MLflow run under the
runner's flow run (experiment ``gpuflows-nexus``; Nona's placements log to ``gpuflows-nona``, ORLOJ's batch
policies to ``gpuflows-orloj``), with a time-series plot; what could not be logged is
named in the result's ``mlflow_errors``. ``backend="ray"`` (under ``GpuRayTaskRunner``) runs the
profiling tasks on Ray and each GPU node's worker as a Ray actor leasing from the runner's ledger.

Placement (the spec's ``placement``, or ``--placement``): ``nexus`` as above; ``shares``, ``nona`` and Nona's
baselines (``undistributed``, ``opportunistic``, ``random``, ``expert``) host every stage of the spec on each of
``placement.nodes`` nodes (a fixed plan, no re-planning), ``shares`` routing each request by its session's shares,
the others each query by the placement they give it: ``nona`` samples it from θ, solved before the rollout from
the profiled stage latencies and the link and re-solved every epoch from the measured query rates and stage
service times (Nona, §III; ``tasks.serving.placement``, ``tasks.serving.nona``). The spec's ``link`` is the bottleneck
link the hand-offs between nodes queue on: by default their bytes cross a loopback socket paced at ``link.mu``
(``tasks.serving.transport``) and Nona solves with the μ the link measured; ``--link emulated`` delays them by
arithmetic instead (``tasks.serving.link``). With ``batch_policy: orloj`` the workers' batches
re-profile ORLOJ every epoch (thesis §4.3.2; ``tasks.serving.epochs``). The figures come from
``tasks.serving.figures``, the MLflow runs from ``tasks.serving.records``.

    python -m flows.serving_rollout --duration-s 20
    python -m flows.serving_rollout --spec scenarios/serving/diamond_nona.yaml --placement nona
    python -m flows.serving_rollout --spec scenarios/serving/diamond_nona.yaml --placement expert
    python -m flows.serving_rollout --duration-s 10 --backend ray

Ctrl-C (SIGINT) stops the rollout at the load generator's next turn: the workers stop (what they had queued is
dropped), every lease goes back to the pool, the flow run ends Cancelled and the command exits 130 with one line
(``tasks.serving.interrupt``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.exceptions import CancelledRun
from prefect.states import Cancelled

from gpu.systems import BATCH_POLICIES
from gpu.errors import ConfigError, GpuflowsError
from gpu.scenario import choose, positive
from gpu.pool import pool_path
from gpu.schedulers.nexus.squishy import SquishyPacker
from gpu.schedulers.nexus.controller import NexusController
from gpu.schedulers.nexus.epoch import EpochPlanner
from gpu.schedulers.nexus.profiles import BatchProfile
from gpuflows.args import error, output_file, simulated
from resource_blocks import GpuPool, MlflowTarget
from tasks.report.occupancy import publish_pool_occupancy
from tasks.report.progress import FlowProgress
from tasks.report.records import Records
from tasks.runtime.flow import (RunIdentity, current_run_name, flow_runner, log_flow_inputs, log_flow_outcome,
                                pool_block, publish_mlflow_link, run_namer, settings, tracking_target)
from tasks.runtime.ray_runner import GpuRayTaskRunner
from tasks.runtime.requests import current_placement, gpu_request
from tasks.runtime.runners import GpuTaskRunner
from tasks.runtime.tracking import ExperimentView, flow_tracker
from tasks.serving.beacons import BeaconLoop
from tasks.serving.epochs import EpochFeedback
from tasks.serving.figures import summarise
from tasks.serving.interrupt import interruptible
from tasks.serving.loadgen import LoadGenerator
from tasks.serving.models import load_digits_tensors, load_or_train, profile_model
from tasks.serving.nona import MeasuredNona, replicated_plan
from tasks.serving.orloj import PROFILE_REQUESTS, app_inputs, orloj_controller, policy_factory
from tasks.serving.placement import NEEDS_LINK, handoff_bytes, link_mu, query_routing
from tasks.serving.records import log_rollout, plan_summary, publish_epochs
from tasks.serving.runtime import LINKS, LocalServingRuntime
from tasks.serving.spec import PLACEMENTS, check_slos, load_spec, parse_spec, serving_system

DEFAULT_SPEC = Path(__file__).resolve().parent.parent / "scenarios" / "serving" / "digits.yaml"
INTERRUPTED = "interrupted (SIGINT/Ctrl-C): serving stopped and every lease went back to the pool"
RAY_TICK_S = 0.002  # with Ray actors every routed burst is a remote call (~0.5 ms): hand arrivals over per 2 ms


@gpu_request(gpus=1)
@task(name="profile-model")
def profile_serving_model(name: str, steps: int, seed: int, repeats: int) -> BatchProfile:
    """Train (or load) one model and measure its batching profile on the placement's device."""
    import torch

    torch.set_num_threads(1)
    placement = current_placement()
    return profile_model(name, load_or_train(name, steps, seed), placement.device if placement else "cpu",
                         repeats=repeats)


def prepare(spec: dict | str | None, duration_s: float | None = None, batch_policy: str | None = None,
            placement: str | None = None, backend: str = "local", mode: str = "process", link: str = "socket"):
    """The serving spec with the flow's overrides, every parameter checked: ``main`` calls it before the flow and
    the flow at its start (a deployment run has no earlier place), so bad input fails before serving starts."""
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    if backend not in BACKENDS:
        raise ConfigError("backend", backend, f"choose one of {BACKENDS}")
    choose(link, "link", list(LINKS))
    path = Path(str(spec or DEFAULT_SPEC))
    if not isinstance(spec, dict) and not path.is_absolute() and not path.exists():
        path = DEFAULT_SPEC.parent.parent.parent / path  # a shipped spec named from the package root (deployments)
    parsed = parse_spec(spec) if isinstance(spec, dict) else load_spec(str(path))
    if duration_s is not None:
        parsed = replace(parsed, duration_s=positive(duration_s, "duration_s"))
    if batch_policy is not None:
        parsed = replace(parsed, batch_policy=choose(batch_policy, "batch_policy", list(BATCH_POLICIES)))
    if placement is not None:
        parsed = replace(parsed, placement=choose(placement, "placement", list(PLACEMENTS)))
    if parsed.placement in NEEDS_LINK and parsed.link_mu is None:
        raise ConfigError("link.mu", None, f"placement {parsed.placement} weighs hand-offs against the link: give "
                                           "its capacity (bytes/s)")
    if parsed.placement != "nexus" and backend != "local":
        raise ConfigError("placement", parsed.placement, "is served by the local backend only")
    return parsed


DEFAULT_POOL = GpuPool(name="serving")
MODES = ("process", "thread")
BACKENDS = ("local", "ray")


VIEWS = {  # how each serving system's experiment opens in MLflow: what to compare, the headline first
    "nexus": ExperimentView(
        "Nexus: compare batch policies (`early_drop`, `lazy_drop`, `fixed_batch`) on the same `spec`. Higher "
        "`goodput_rps` (requests answered within their SLO per second) and `slo_attainment` win, on no more "
        "`max_gpus`; every epoch is a nested run with its plan.",
        metrics=("goodput_rps", "slo_attainment", "bad_rate", "max_gpus"),
        params=("batch_policy", "placement", "spec")),
    "nona": ExperimentView(
        "Nona: compare `placement` = `nona` against its baselines (`opportunistic`, `undistributed`, `random`, "
        "`expert`) on the same `spec`, trace and link (deployments serving-rollout-nona and "
        "serving-rollout-nona-opportunistic). Lower `bad_rate` (queries late or dropped) and `p99_latency_ms` win.",
        metrics=("bad_rate", "p99_latency_ms", "goodput_rps", "slo_attainment"), params=("placement", "spec",
                                                                                        "batch_policy")),
    "orloj": ExperimentView(
        "ORLOJ: compare `batch_policy` = `orloj` against the Clockwork- and Clipper-like `clockwork` and `clipper` "
        "on the same `spec`. Higher `slo_attainment` (requests within their SLO) and `goodput_rps` win.",
        metrics=("slo_attainment", "goodput_rps", "bad_rate"), params=("batch_policy", "spec", "placement")),
}


def rollout_identity(placement: str, batch_policy: str) -> RunIdentity:
    """The system the rollout runs (``tasks.serving.spec.serving_system``: Nona for Nona's placement and its
    baselines, ORLOJ for its batch policies, else Nexus) names the experiment; the run name says the placement
    (unless Nexus's packed plan) and the batch policy: ``nexus-early_drop-<time>``, ``nona-early_drop-<time>``,
    ``nona-opportunistic-early_drop-<time>``, ``orloj-<time>``, ``orloj-clockwork-<time>``."""
    return RunIdentity(serving_system(placement, batch_policy), (None if placement == "nexus" else placement,
                                                                 batch_policy))


def identity(parameters: dict) -> RunIdentity:
    """``rollout_identity`` of the spec the parameters name, with their overrides (bad input: Nexus's, the flow's
    own checks report it)."""
    try:
        sp = prepare(parameters.get("spec"), None, parameters.get("batch_policy"), parameters.get("placement"))
    except (GpuflowsError, OSError, ValueError, TypeError):
        return rollout_identity("nexus", str(parameters.get("batch_policy") or "early_drop"))
    return rollout_identity(sp.placement, sp.batch_policy)


def runner_settings(parameters: dict) -> dict:
    """The flow's task runner from its own parameters (``pool``, ``mode``, ``tracking``): every entry point alike
    (on ``GpuRayTaskRunner`` too, which has no ``mode``)."""
    return settings(parameters, DEFAULT_POOL, identity(parameters).experiment)


@flow(name="serving-rollout", flow_run_name=run_namer(identity), task_runner=GpuTaskRunner(configure=runner_settings))
def serving_rollout(spec: dict | str | None = None, duration_s: float | None = None,
                    batch_policy: str | None = None, backend: str = "local", pool: GpuPool | str | None = None,
                    mode: str = "process", tracking: MlflowTarget | bool | str | None = None,
                    placement: str | None = None, link: str = "socket") -> dict[str, Any]:
    """Profile, plan, roll out and serve the spec's trace, re-planning every epoch; returns the figures.

    Args:
        spec: a serving spec (mapping, or a YAML/JSON path; default ``scenarios/serving/digits.yaml``).
        duration_s: override the trace length (s).
        batch_policy: override the workers' batch policy (``early_drop``, ``lazy_drop``, ``fixed_batch``, ``orloj``
            — with each model's alone times profiled first — or the Clockwork-/Clipper-like
            ``clockwork``/``clipper``); each worker gets its own instance.
        backend: ``local`` (worker threads in this process) or ``ray`` (a Ray actor per GPU node; run the
            flow under ``GpuRayTaskRunner``, whose ledger the actors' leases then share with Ray tasks).
        pool: GpuPool block whose ledger the workers lease from, a saved block's name, or None (pool "serving" on
            simulated devices; on NVML GPUs the machine's one pool, "default").
        mode: GpuTaskRunner mode of the profiling tasks ("process" or "thread").
        tracking: MlflowTarget block, the name of a saved one, False to switch MLflow off, None for the system's
            experiment: ``gpuflows-nexus``, ``gpuflows-nona`` (Nona's placement or a baseline) or ``gpuflows-orloj``
            (ORLOJ's batch policies).
        placement: override the spec's placement (``nexus``, ``shares``, ``nona`` or a Nona baseline:
            ``undistributed``, ``opportunistic``, ``random``, ``expert``; module docstring).
        link: the bottleneck link between nodes, ``socket`` (real bytes over loopback, paced at ``link.mu``) or
            ``emulated`` (a computed delay).

    Returns:
        The figures (``tasks.serving.figures.summarise``: per epoch and over the run, queries, dispatch
        overhead), ``mlflow_run_id`` and ``mlflow_errors`` (what could not be logged to MLflow; empty when everything was).
        Interrupted (SIGINT, Ctrl-C): a Cancelled state saying so, once the workers stopped and their leases
        went back.
    """
    try:
        return _rollout(spec, duration_s, batch_policy, backend, pool, mode, tracking, placement, link)
    except KeyboardInterrupt:  # every lease is back by now: the runtime closed on the way out
        get_run_logger().warning(INTERRUPTED)
        return Cancelled(message=INTERRUPTED)


def _rollout(spec: dict | str | None, duration_s: float | None, batch_policy: str | None, backend: str,
             pool: GpuPool | str | None, mode: str, tracking: MlflowTarget | bool | str | None,
             placement: str | None, link: str) -> dict[str, Any]:
    """The body of ``serving_rollout`` (its arguments and result)."""
    sp = prepare(spec, duration_s, batch_policy, placement, backend, mode, link)
    runner = flow_runner()  # the pool and target resolved from these parameters (or the runner given)
    if backend == "ray" and not isinstance(runner, GpuRayTaskRunner):
        raise ConfigError("backend", backend, "needs the flow on GpuRayTaskRunner (`python -m flows.serving_rollout "
                                              "--backend ray`, or deploy serving_rollout.with_options(task_runner="
                                              "GpuRayTaskRunner(configure=runner_settings)))")
    pool = runner.pool if runner else pool_block(pool, DEFAULT_POOL)
    who = rollout_identity(sp.placement, sp.batch_policy)
    tracking = runner.tracking if runner else tracking_target(tracking, who.experiment)
    ledger = runner.ledger() if runner else pool.open_ledger()
    parent = publish_mlflow_link(runner) if tracking.enabled else None
    log_flow_inputs(who, {"spec": sp.name, "batch_policy": sp.batch_policy, "duration_s": sp.duration_s,
                          "models": ",".join(sp.models), "backend": backend, "pool": pool.name, "seed": sp.seed,
                          "mode": mode, "placement": sp.placement}, VIEWS[who.system])
    futures, prev = {}, None
    for m in sp.models:  # one at a time: concurrent profiling on shared devices would skew the timings
        prev = futures[m] = profile_serving_model.submit(m, sp.training_steps, sp.seed, sp.profile_repeats,
                                                         wait_for=[prev] if prev else None)
    profiles = {m: f.result() for m, f in futures.items()}
    sessions = sp.planned_sessions(profiles)
    check_slos(sessions, profiles, sp.preset)
    models = {m: load_or_train(m, sp.training_steps, sp.seed) for m in sp.models}
    pool_gpus = sum(len(n.devices) for n in ledger.capacity)  # a surge is planned within the pool, not beyond it
    planner = EpochPlanner(SquishyPacker(profiles, sp.preset), sessions, sp.epoch, max_gpus=pool_gpus)
    chains = sp.chains()  # a query as a DAG (see tasks.serving.spec)
    # the controller the simulator runs, here on the real clock: epochs, routing and chaining
    controller = NexusController(planner if sp.placement == "nexus" else None, chains=chains,
                                 load_balancer=sp.load_balancer, rng=sp.seed, time_unit="ns")
    if sp.placement != "nexus":  # every node hosts every stage; the plan stays fixed
        controller.plan = replicated_plan(sessions, profiles, sp.nodes)
    solver_mu = link_mu(sp, link) if sp.placement in ("nona", "expert") else sp.link_mu
    routing = query_routing(sp, profiles, solver_mu)
    if sp.placement == "nona":
        get_run_logger().info("Nona θ solved: %s", {f"{k}/{r}": [round(x, 3) for x in th] for (k, r), th
                                                     in routing.controller.table.entries[0].thetas.items()})
    trace = sp.trace(sessions, issued=set(chains))
    data = load_digits_tensors(sp.seed)
    orloj = (orloj_controller(models, profiles, sessions, sp.apps, data.x_test[:PROFILE_REQUESTS].numpy(),
                              sp.epoch.epoch_s, sp.seed) if sp.batch_policy == "orloj" else None)
    nona = MeasuredNona(routing, sp.nodes, solver_mu, sp.seed) if sp.placement == "nona" else None
    with interruptible() as interrupt, LocalServingRuntime(
            models, profiles, ledger, None, sp.preset, seed=sp.seed, backend=backend, controller=controller,
            policy_factory=policy_factory(sp.batch_policy, orloj), query_routing=routing, link_mu=sp.link_mu,
            handoff_bytes=handoff_bytes(sp), apps=sp.app_slos or None,
            measure_batches=orloj is not None or nona is not None, link=link, label=current_run_name(who)) as rt:
        rt.apply(controller.plan)
        if nona is not None:  # every epoch, the link's μ as measured on the hand-offs it carried
            nona.link = rt.link
        feedback = EpochFeedback(sp.epoch.epoch_s, rt.take_batches, rt.update_policies, orloj, nona)
        progress = FlowProgress("serving-rollout", sp.duration_s, f"serving {sp.name}", unit="s of trace").start()

        def replanned(t_s: float, new) -> None:
            get_run_logger().info("epoch at %.0f s: re-planned onto %d GPU(s), %.0f req/s unassigned: %s",
                                  t_s, new.num_gpus, sum(r for _, r in new.unassigned), plan_summary(new))

        on_beacon = BeaconLoop(rt, controller, feedback, sp.duration_s, sp.epoch.beacon_s,
                               lambda t_s: progress.update(min(t_s, sp.duration_s), f"{rt.plan.num_gpus} GPU(s), "
                                                                                    f"epoch {len(planner.epochs)}"),
                               replanned)
        ray = backend == "ray"  # a turn's bursts to one actor as one Ray call, a turn per 2 ms
        load = LoadGenerator(rt.frontend.submit, trace, data.x_test, data.y_test, sp.seed, rt.frontend.submit_many,
                             RAY_TICK_S if ray else 0.0, rt.frontend.turn if ray else None,
                             app_inputs(sp, data.x_test.numpy())).run(on_beacon, sp.epoch.beacon_s, stop=interrupt)
        progress.close()
        if load.interrupted:  # raised here, where closing the runtime stops the workers and releases the leases
            raise KeyboardInterrupt
    marks, beacons = on_beacon.marks, on_beacon.beacons
    result = summarise(sp, rt, load, marks, beacons, profiles)
    result.update(orloj_epochs=feedback.orloj_epochs, nona_epochs=feedback.nona_epochs)
    if nona is not None:  # θ in force at the end per (class, subgraph root), aligned with its Ω
        result["nona_theta"] = nona.thetas
    result.update(link=link, **({"solver_link_mu": solver_mu} if solver_mu is not None else {}))
    records = Records(tracking.resolved_uri() if tracking.enabled else None, parent)
    publish_epochs(records, sp, result["epochs"])
    publish_pool_occupancy(runner)
    result["mlflow_run_id"] = parent
    if tracking.enabled:  # the figures are the result; a store that fails is named in it, not fatal
        with records.kept("the rollout's epochs and figures were not logged to MLflow"):
            if not records.enabled:  # no GPU task runner opened the flow's run: a run of their own
                records = Records.own_run(tracking.resolved_uri(), tracking.resolved_experiment(), who.run_name())
            result["mlflow_run_id"] = log_rollout(records, sp, result, marks, beacons, profiles)
    log_flow_outcome({"goodput_rps": result["throughput_rps"] * (1.0 - result["bad_rate"]),
                      **{k: result[k] for k in ("throughput_rps", "offered_rps", "bad_rate", "slo_attainment",
                                                "p99_latency_ms", "accuracy", "max_gpus", "replans") if k in result}})
    tracker = flow_tracker()
    result["mlflow_errors"] = records.errors + (tracker.flush() if tracker else [])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.serving_rollout", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(DEFAULT_SPEC), help="serving spec (YAML/JSON); default: %(default)s")
    ap.add_argument("--duration-s", type=float, default=None, help="override the trace length (default: the spec's)")
    ap.add_argument("--batch-policy", default=None, help="early_drop (Nexus), lazy_drop, fixed_batch, orloj, clockwork or clipper")
    ap.add_argument("--pool", default=None, help="GpuPool name whose ledger the workers lease from (default: "
                    "\"serving\" on simulated devices, the machine's one pool on real GPUs)")
    ap.add_argument("--simulated", type=simulated, default="2x16GiB",
                    help="simulated devices when the machine has no GPU")
    ap.add_argument("--mode", choices=("process", "thread"), default="process", help="profiling task mode")
    ap.add_argument("--experiment", default=None, help="MLflow experiment (default: gpuflows-nexus; Nona's "
                    "placements gpuflows-nona, ORLOJ's batch policies gpuflows-orloj)")
    ap.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    ap.add_argument("--json", type=output_file, default=None, help="write the result (figures per epoch) to this file")
    ap.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="workers as threads here (local) or Ray actors (ray: the pool's ray_address, else a local Ray)")
    ap.add_argument("--placement", default=None,
                    help="override the spec's placement: nexus (packed plan), or every stage on every node routed by "
                         "shares, nona or a Nona baseline (undistributed, opportunistic, random, expert)")
    ap.add_argument("--link", choices=("socket", "emulated"), default="socket",
                    help="the link between nodes: hand-offs' bytes over a loopback socket paced at link.mu (socket), "
                         "or a computed delay with no bytes moved (emulated)")
    args = ap.parse_args(argv)
    try:  # a bad spec, duration, policy or pool name fails here, before a Prefect server starts
        prepare(args.spec, args.duration_s, args.batch_policy, args.placement, args.backend, args.mode, args.link)
        if args.pool:
            pool_path(args.pool)
    except GpuflowsError as exc:
        return error(exc)
    pool = GpuPool(name=args.pool or DEFAULT_POOL.name, simulated=args.simulated)
    pool = pool if args.pool else pool.on_this_machine()
    tracking = MlflowTarget(experiment=args.experiment, enabled=not args.no_tracking)
    rollout = serving_rollout
    if args.backend == "ray":  # the same flow and parameters, its tasks on Ray
        rollout = serving_rollout.with_options(task_runner=GpuRayTaskRunner(configure=runner_settings))
    try:
        result = rollout(args.spec, args.duration_s, args.batch_policy, args.backend, pool=pool, mode=args.mode,
                         tracking=tracking, placement=args.placement, link=args.link)
    except GpuflowsError as exc:
        return error(exc)
    except (KeyboardInterrupt, CancelledRun) as exc:  # Cancelled by the flow, or interrupted outside its body
        print(f"serving-rollout: {exc if isinstance(exc, CancelledRun) else INTERRUPTED}", file=sys.stderr)
        return 130
    for e in result["epochs"]:
        print(f"epoch {e['epoch']} [{e['start_s']:5.1f}-{e['end_s']:5.1f}s] gpus={e['gpus']} "
              f"offered={e['offered_rps']:7.1f}/s good={e['throughput_rps']:7.1f}/s "
              f"slo={e['slo_attainment']:.3f} bad={e['bad_rate']:.3f} p99={e['p99_latency_ms']:.2f}ms"
              + (" (re-planned)" if e["replanned"] and e["epoch"] else ""))
    for e in result["nona_epochs"]:  # Nona's decision at each epoch end, from the rates and stage times measured
        print(f"nona @ {e['t_s']:4.1f}s: rates {', '.join(f'{q}={r:.1f}/s' for q, r in e['rates'].items())} -> "
              + ("re-solved θ" if e["resolved"] else "θ kept"))
    for e in result["orloj_epochs"]:
        limits = ", ".join(f"{app}<={a['batch_limit']}" for app, a in e["apps"].items())
        print(f"orloj @ {e['t_s']:4.1f}s: batch limits {limits}")
    print(f"dispatch overhead {result['dispatch_overhead_us']:.1f} us/request = "
          f"{100 * result['dispatch_overhead_frac_of_batch1']:.1f}% of the smallest model's batch-1 latency "
          f"({result['smallest_batch1_us']:.1f} us); accuracy {result['accuracy']:.3f}")
    for qid, q in result["queries"].items():
        print(f"query {qid} (served as a DAG): {q['queries']} queries, {100 * q['bad_rate']:.2f}% bad, "
              f"mean JCT {q['mean_jct_ms']:.2f} ms, p99 {q['p99_jct_ms']:.2f} ms")
    if result["handoffs"]:
        print(f"placement {result['placement']}: {result['cross_node_handoffs']:.0f} of {result['handoffs']:.0f} "
              f"hand-offs crossed nodes" + (f", link mean wait {result['link_mean_wait_ms']:.2f} ms"
                                            if "link_mean_wait_ms" in result else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
