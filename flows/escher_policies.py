"""ESCHER policies on real Prefect tasks, each written only as ``set_resource`` calls plus resource requests
(Bhardwaj, ESCHER, thesis ch. 4: Table 4.2, §4.4e–f, §4.5 Fig. 4.5a and 4.6).

Every task is a small torch or data job (``tasks/escher/jobs.py``) run by ``GpuTaskRunner`` on a pool of several
simulated nodes; no policy code lives in the runner or the ledger. The flow is the ESLs' world: it drives the
engine's ESLs (``gpu.schedulers.escher``) with its real clock and applies their decisions on the pool ledger. The
flow itself only checks its input (``tasks/escher/settings.py``), runs each chosen policy (``tasks/escher/demos.py``,
one module per policy beside it) and records the run. Policies (``--policy``, repeatable; default all; the same
names as ``gpuflows simulate escher`` and a ``SchedulerPolicy(system="escher")``):

- ``affinity`` (Table 4.2, P3 and P1): two serving replicas request ``anti-replicas`` (capacity 1 per node), so
  they run on distinct nodes; a producer creates ``coloc-producer`` on its own node from inside its task, and a
  consumer submitted beside it waits for that resource and lands on the producer's node.
- ``gang`` (§4.4e, AppSpace): one GPU *ghost* per member (spread by anti-affinity) backs a unit of ``gang-<g>``
  on its node (``lease_resource``, P4); the members request only ``{gang-<g>: 1}``, start together on the ghosts'
  devices and train one data-parallel model through a gloo all-reduce. Ghosts not all held within the timeout are
  rolled back and retried after jittered back-off; a member that fails or dies ends the others at once.
- ``hfs`` (§4.4f, Fig. 4.5c): ``HierarchicalFairShare`` over the nodes, team A (one user) and team B (two users),
  rebalanced every 0.2 s by ``FairShareMonitor`` on each user's unfinished jobs (the simulator's loop, on the wall
  clock): nodes a user leaves idle go to users with work left.
- ``locality`` (§4.5, Fig. 4.5a): WordCount over per-node local files, run without and with the paper's two-line
  change (the writer's ``store_data``, the mapper's ``{data-<shard>: 1}``); bytes read across nodes are counted.
- ``colocation`` (§4.5, Fig. 4.6a): AlphaZero predictors on GPU slices, load-balanced one per node, each with its
  CPU board aggregator co-located through ``coloc-predictor-<i>``.
- ``tune`` (§4.5, Fig. 4.6c, EscherTune): short jobs one per node, then a two-worker data-parallel trial spread by
  GPU availability; once a short job's end leaves a node room for both workers and the trial's measured rate says
  the move pays, the workers checkpoint and stop, ``trial-<id>`` moves, and the relaunched workers, with unchanged
  requests, resume from the checkpoint there.

MLflow: experiment ``gpuflows-escher``, a run nested under the flow's run per policy (every task's node, the
``set_resource`` log as ``set_resource.json``, the policy's lines of code beside the paper's, its metrics); Prefect
table artifact ``escher-actions``: every ``set_resource`` the ESLs and tasks made.

    python -m flows.escher_policies --nodes 4 --gang-size 2 --policy gang --policy locality
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict
from typing import Any

from prefect import flow

from gpu.errors import ConfigError, GpuflowsError
from gpu.schedulers.escher.policies import POLICIES
from gpu.scenario import integer
from gpuflows.args import error, flow_parser
from resource_blocks import GpuPool, MlflowTarget, SchedulerPolicy
from resource_blocks.gpu_pool import MAX_NODES
from tasks.escher.demos import DEMOS, run_policy
from tasks.escher.records import publish_policies
from tasks.escher.settings import Settings, check_settings, choose
from tasks.runtime.flow import (RunIdentity, flow_runner, log_flow_inputs, log_flow_outcome, pool_block,
                                publish_mlflow_link, run_namer, settings, tracking_target)
from tasks.runtime.ray_runner import GpuRayTaskRunner
from tasks.runtime.runners import GpuTaskRunner
from tasks.runtime.tracking import ExperimentView

MODES = ("thread", "process")
BACKENDS = ("local", "ray")
DEFAULT_POOL = GpuPool(name="escher", device_backend="simulated", simulated="1x16GiB", nodes=4)


VIEW = ExperimentView(
    "ESCHER: each run is a set of demos, one nested run per policy (where each task ran, the ESL calls). The "
    "headline: a gang's start latency, and WordCount's bytes moved with locality against without.",
    metrics=("gang_gang_latency_s", "locality_locality_transfer_bytes", "locality_no_locality_transfer_bytes"),
    params=("policies", "mode", "seed"))


def identity(parameters: dict) -> RunIdentity:
    """Experiment ``gpuflows-escher``; runs named by the policies they ran: ``escher-all-<time>``,
    ``escher-gang+hfs-<time>``."""
    try:
        chosen, _ = choose(parameters.get("policies"), parameters.get("policy"), parameters)
    except (GpuflowsError, ValueError, TypeError, KeyError):  # bad input: prepare() reports it
        chosen = tuple(POLICIES)
    return RunIdentity("escher", ("all" if set(chosen) == set(POLICIES) else "+".join(chosen),))


def runner_settings(parameters: dict) -> dict:
    """The flow's GPU task runner from its own parameters (``pool``, ``mode``, ``tracking``). In process mode the
    runner keeps one worker pool per set of visible devices, and every simulated node's GPU is device 0: the
    pool needs a worker for each task that must run at once (a gang's members, AlphaZero's predictors)."""
    try:
        _, params = choose(parameters.get("policies"), parameters.get("policy"), parameters)
        together = max(2, int(params["gang_size"]), int(params["pairs"]))
    except (GpuflowsError, ValueError, TypeError, KeyError):  # bad input: prepare() reports it before any task runs
        together = 2
    return settings(parameters, DEFAULT_POOL, identity(parameters).experiment, workers_per_device_set=together)


def prepare(pool: GpuPool | str | dict | None, tracking: MlflowTarget | bool | str | None, *, mode: str,
            policies: list[str] | None = None, policy: SchedulerPolicy | str | dict | None = None,
            **params: Any) -> tuple[GpuPool, MlflowTarget, tuple[str, ...], Settings]:
    """The flow's pool, MLflow target, policies and settings, every parameter checked: the flow calls it for
    deployment runs, ``main`` before the flow, so a bad argument fails before a flow run starts."""
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    block = pool_block(pool, DEFAULT_POOL)
    if block.nodes < 2:
        raise ConfigError("pool.nodes", block.nodes, "anti-affinity, gangs and migration need at least 2 nodes")
    chosen, params = choose(policies, policy, {**asdict(Settings()), **params})
    return block, tracking_target(tracking, identity({}).experiment), chosen, check_settings(params, block.nodes)


@flow(name="escher-policies", log_prints=True, flow_run_name=run_namer(identity),
      task_runner=GpuTaskRunner(configure=runner_settings))
def escher_policies(policies: list[str] | None = None, policy: SchedulerPolicy | str | None = None,
                    gang_size: int = Settings.gang_size, gang_timeout_s: float = Settings.gang_timeout_s,
                    team_weights: list[float] | None = None, jobs: int = Settings.jobs, steps: int = Settings.steps,
                    seed: int = Settings.seed, shards: int = Settings.shards, words: int = Settings.words,
                    reducers: int = Settings.reducers, pairs: int = Settings.pairs, rounds: int = Settings.rounds,
                    pool: GpuPool | str | None = None,
                    mode: str = "thread", tracking: MlflowTarget | bool | str | None = None) -> dict:
    """Run ESCHER's policies on real tasks; return, per policy, where every task ran and what it measured, and the
    ESL actions.

    Args:
        policies: which demos run, from ``POLICIES`` (default all): affinity, gang, hfs, locality (WordCount),
            colocation (AlphaZero), tune (EscherTune).
        policy: a SchedulerPolicy (``system="escher"``), or a saved one's name: runs its ``policy`` alone, its
            ``params`` (any of the parameters below) applied over the flow's.
        gang_size: members of the data-parallel gang (one GPU ghost each, one per node).
        gang_timeout_s: AppSpace's timeout for all ghosts to start before a rollback.
        team_weights: HFS weights of team A and team B (default [1, 1]).
        jobs: tasks per HFS user; steps: SGD steps per task (EscherTune's trial: 100x, its short jobs 10x-40x).
        seed: the gang's back-off jitter, WordCount's text, AlphaZero's positions.
        shards, words, reducers: WordCount's input shards, words per shard, reducers.
        pairs, rounds: AlphaZero's predictor/aggregator pairs and board rounds per pair.
        pool: GpuPool block, saved block name, or None (pool "escher": 4 simulated nodes of one 16 GiB GPU).
        mode: "thread" (default: simulated nodes share this machine) or "process".
        tracking: MlflowTarget block, saved block name, False, or None for the default target.
    """
    team_weights = list(Settings.team_weights) if team_weights is None else team_weights
    _, _, chosen, s = prepare(pool, tracking, mode=mode, policies=policies, policy=policy, gang_size=gang_size,
                              gang_timeout_s=gang_timeout_s, team_weights=team_weights, jobs=jobs, steps=steps,
                              seed=seed, shards=shards, words=words, reducers=reducers, pairs=pairs, rounds=rounds)
    publish_mlflow_link()
    log_flow_inputs(identity({"policies": list(chosen)}), {"policies": ",".join(chosen), "mode": mode, **asdict(s)},
                    VIEW)
    ledger = flow_runner().ledger()
    nodes = sorted(ledger.cluster_status())
    if len(nodes) < 2:  # a Ray cluster's nodes are known only now
        raise ConfigError("pool.nodes", len(nodes), "anti-affinity and gangs across nodes need at least 2 nodes")
    with tempfile.TemporaryDirectory(prefix="escher-") as workdir:
        results = {name: run_policy(name, ledger, nodes, s, workdir) for name in chosen}
    actions = [a for out in results.values() for a in out["actions"]]
    errors = publish_policies(results, DEMOS, actions)
    log_flow_outcome({f"{name}_{k}": v for name, out in results.items() for k, v in out.get("metrics", {}).items()})
    return {"nodes": nodes, "policies": list(chosen), **results, "actions": actions, "mlflow_errors": errors}


def report(out: dict) -> list[str]:
    """The run as lines for the terminal: placements, measurements and lines of code beside the paper's."""
    lines = []
    if "affinity" in out:
        p = out["affinity"]
        lines += ["anti-affinity: replicas on " + ", ".join(r["node"] for r in p["replicas"]),
                  f"affinity: producer on {p['producer']['node']}, consumer on {p['consumer']['node']}"]
    if "gang" in out:
        g = out["gang"]
        lines.append(f"gang: {len(g['members'])} members on " + ", ".join(
            f"{m['node']} gpu{m['devices']}" for m in g["members"])
            + f" after {g['gang_latency_s']:.2f} s ({g['attempts']} attempt(s))")
    if "hfs" in out:
        m = out["hfs"]["metrics"]
        lines.append("HFS shares at the start: " + ", ".join(f"{u} {n}" for u, n in out["hfs"]["shares"].items())
                     + f"; {m['rebalances']} rebalances, most nodes held: "
                     + ", ".join(f"{u} {m[f'peak_share_{u}_nodes']}" for u in out["hfs"]["shares"]))
    if "locality" in out:
        for label in ("no_locality", "locality"):
            w = out["locality"][label]
            lines.append(f"WordCount {label.replace('_', '-')}: makespan {w['makespan_s']:.2f} s, "
                         f"transfer {w['transfer_bytes']} of {w['input_bytes']} bytes ({w['transfer_share']:.1%})")
    if "colocation" in out:
        lines.append("AlphaZero: " + ", ".join(f"predictor-{i} {p['predictor']['node']} / aggregator "
                                               f"{p['aggregator']['node']}" for i, p in enumerate(out["colocation"]["pairs"])))
    if "tune" in out:
        t, m = out["tune"], out["tune"]["metrics"]
        where = " -> ".join("+".join(f"{n}x{w}" for n, w in p.items()) for p in t["placements"])
        lines.append(f"EscherTune: trial on {where}; " + (
            f"consolidated at step {m['moved_at_step']} (measured {t['moves'][0]['rate']:.0f} steps/s, "
            f"{t['moves'][0]['remaining_s']:.2f} s left > launch {t['moves'][0]['launch_s']:.2f} s), resumed at "
            f"step {m['resumed_step']} (loss {m['loss_at_checkpoint']:.4f} -> {m['loss_on_resume']:.4f}); "
            f"{m['rate_spread_steps_s']:.0f} steps/s spread, {m['rate_after_steps_s']:.0f} after"
            if t["moves"] else "never consolidated (no node had room while the move paid)"))
    for name in out["policies"]:
        paper = DEMOS[name].paper_lines
        lines.append(f"lines of code, {DEMOS[name].run_name}: {out[name]['esl_lines']}"
                     + (f" (paper: {paper})" if paper else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = flow_parser("flows.escher_policies", __doc__)
    d = Settings()
    parser.add_argument("--policy", action="append", dest="policies", metavar="NAME",
                        help=f"run this policy (repeatable; default all): {', '.join(POLICIES)}")
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes of the pool (default 4)")
    parser.add_argument("--pool", default="escher", help="pool name (flows naming the same pool share it)")
    parser.add_argument("--gang-size", type=int, default=d.gang_size, help="data-parallel gang members (default 2)")
    parser.add_argument("--gang-timeout-s", type=float, default=d.gang_timeout_s,
                        help="AppSpace ghost timeout (default 30)")
    parser.add_argument("--team-weights", type=float, nargs=2, default=list(d.team_weights), metavar=("A", "B"),
                        help="HFS weights of the two teams (default 1 1)")
    parser.add_argument("--jobs", type=int, default=d.jobs, help="tasks per HFS user (default 2)")
    parser.add_argument("--steps", type=int, default=d.steps, help="SGD steps per task (default 30)")
    parser.add_argument("--shards", type=int, default=d.shards, help="WordCount input shards (default 8)")
    parser.add_argument("--words", type=int, default=d.words, help="words per WordCount shard (default 20000)")
    parser.add_argument("--reducers", type=int, default=d.reducers, help="WordCount reducers (default 2)")
    parser.add_argument("--pairs", type=int, default=d.pairs, help="AlphaZero predictor/aggregator pairs (default 2)")
    parser.add_argument("--rounds", type=int, default=d.rounds, help="AlphaZero board rounds per pair (default 20)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of the text, boards and back-off (default 0)")
    parser.add_argument("--mode", default="thread", help=f"runner mode, one of {MODES} (default thread)")
    parser.add_argument("--no-tracking", action="store_true", help="switch MLflow tracking off")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="tasks on simulated nodes here (local) or on a Ray cluster's nodes (ray: needs --ray-address)")
    parser.add_argument("--ray-address", default=None, help="the Ray cluster (ip:port) for --backend ray")
    args = parser.parse_args(argv)
    kwargs = dict(policies=args.policies, gang_size=args.gang_size, gang_timeout_s=args.gang_timeout_s,
                  team_weights=args.team_weights, jobs=args.jobs, steps=args.steps, shards=args.shards,
                  words=args.words, reducers=args.reducers, pairs=args.pairs, rounds=args.rounds, seed=args.seed,
                  mode=args.mode, tracking=False if args.no_tracking else None)
    try:  # before a Prefect server starts
        integer(args.nodes, "nodes", minimum=2, maximum=MAX_NODES)
        if args.backend == "ray" and not args.ray_address:
            raise ConfigError("ray_address", None, "--backend ray needs a cluster of 2 or more nodes (a local Ray has one)")
        pool = GpuPool(name=args.pool, device_backend="simulated", simulated="1x16GiB", nodes=args.nodes,
                       ray_address=args.ray_address)
        pool.open_ledger().close()  # the pool name and its layout, checked
        kwargs["pool"], kwargs["tracking"], _, _ = prepare(pool, **kwargs)
        policies = escher_policies
        if args.backend == "ray":  # the same flow and parameters, its tasks on the cluster's nodes
            policies = escher_policies.with_options(task_runner=GpuRayTaskRunner(configure=runner_settings))
        out = policies(**kwargs)
    except GpuflowsError as exc:
        return error(exc)
    print("\n".join(report(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
