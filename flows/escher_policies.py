"""ESCHER policies on real Prefect tasks, each written only as ``set_resource`` calls plus resource requests
(Bhardwaj, ESCHER, thesis ch. 4: Table 4.2, §4.4e–f, §4.5 Fig. 4.5a and 4.6).

Every task is a small torch or data job (``tasks/escher_jobs.py``) run by ``GpuTaskRunner`` on a pool of several
simulated nodes; no policy code lives in the runner or the ledger. The flow is the ESLs' world: it drives the
engine's ESLs (``gpu.schedulers.escher``) with its real clock and applies their decisions on the pool ledger.
Policies (``--policy``, repeatable; default all):

- ``affinity`` (Table 4.2, P3 and P1): two serving replicas request ``anti-replicas`` (capacity 1 per node), so
  they run on distinct nodes; a producer creates ``coloc-producer`` on its own node from inside its task, and a
  consumer submitted beside it waits for that resource and lands on the producer's node.
- ``gang`` (§4.4e, AppSpace): one GPU *ghost* per member (spread by anti-affinity) backs a unit of ``gang-<g>``
  on its node (``lease_resource``, P4); the members request only ``{gang-<g>: 1}``, start together on the ghosts'
  devices and train one data-parallel model through a gloo all-reduce. Ghosts not all held within the timeout are
  rolled back and retried after jittered back-off.
- ``hfs`` (§4.4f): ``HierarchicalFairShare`` over the nodes, team A (one user) and team B (two users).
- ``locality`` (§4.5, Fig. 4.5a): WordCount over per-node local files, run without and with the paper's two-line
  change (the writer's ``store_data``, the mapper's ``{data-<shard>: 1}``); bytes read across nodes are counted.
- ``colocation`` (§4.5, Fig. 4.6a): AlphaZero predictors on GPU slices, load-balanced one per node, each with its
  CPU board aggregator co-located through ``coloc-predictor-<i>``.
- ``tune`` (§4.5, Fig. 4.6c, EscherTune): a trial trains, checkpoints and stops; the ESL moves ``trial-<id>`` to
  another node and the relaunched task, with unchanged requests, resumes from the checkpoint there.

MLflow: experiment ``gpuflows-escher``, a run nested under the flow's run per policy (every task's node, the
``set_resource`` log as ``set_resource.json``, the policy's lines of code beside the paper's, its metrics); Prefect
table artifact ``escher-actions``: every ``set_resource`` the ESLs and tasks made.

    python -m flows.escher_policies --nodes 4 --gang-size 2 --policy gang --policy locality
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

from prefect import flow
from prefect.futures import as_completed

from gpu.errors import ConfigError, GpuflowsError
from gpu.schedulers.escher.api import Escher, NodeSpec
from gpu.schedulers.escher.effort import source_lines
from gpu.schedulers.escher.gang import AppSpaceGang
from gpu.schedulers.escher.hfs import HierarchicalFairShare, water_fill
from gpu.schedulers.escher.primitives import anti_affinity, colocate, store_data, with_task
from gpu.scenario import integer, positive
from gpuflows.args import error
from resource_blocks import GpuPool, MlflowTarget, SchedulerPolicy
from tasks.escher_gang import run_gang
from tasks.escher_jobs import (board_aggregator, consumer, map_shard, predictor, producer, reduce_partition, replica,
                               team_job, trial_chunk, write_shard)
from tasks.escher_tracking import Demo, log_policy_runs
from tasks.flow_runtime import (flow_runner, log_flow_inputs, log_flow_outcome, pool_block, publish_mlflow_link,
                                settings, tracking_target)
from tasks.requests import gpu_options
from tasks.runners import GpuTaskRunner
from tasks.ui import publish_table

MODES = ("thread", "process")
BACKENDS = ("local", "ray")
DEFAULT_POOL = GpuPool(name="escher", device_backend="simulated", simulated="1x16GiB", nodes=4)
EVERY_NODE = NodeSpec()
MOVES = 16  # candidate moves an AlphaZero aggregator expands per round


@dataclass(frozen=True)
class Settings:
    """The flow's parameters as the policies read them (a SchedulerPolicy's ``params`` may set any of them)."""

    gang_size: int = 2
    gang_timeout_s: float = 30.0
    team_weights: tuple[float, float] = (1.0, 1.0)
    jobs: int = 2
    steps: int = 30
    seed: int = 0
    shards: int = 8
    words: int = 20000
    reducers: int = 2
    pairs: int = 2
    rounds: int = 20


# -- the ESLs' world ------------------------------------------------------------------------------
def run_placement(esl: Escher, steps: int) -> dict:
    """Table 4.2's anti-affinity (two replicas) and affinity (a consumer follows its producer)."""
    spread = anti_affinity(esl, "replicas")
    with gpu_options(resources=spread):
        replicas = [replica.with_options(name=f"replica-{i}").submit(f"replica-{i}", steps) for i in range(2)]
    made = producer.submit(steps)
    with gpu_options(resources=with_task("producer")):  # queued at once; waits for the producer's resource
        follower = consumer.submit(steps)
    out = {"replicas": [f.result() for f in replicas], "producer": made.result(), "consumer": follower.result()}
    esl.delete_resource("anti-replicas", EVERY_NODE)
    esl.delete_resource("coloc-producer", out["producer"]["node"])
    out["tasks"] = [*out["replicas"], out["producer"], out["consumer"]]
    return out


def run_hfs(esl: Escher, nodes: list[str], team_weights: tuple[float, float], jobs: int, steps: int) -> dict:
    """§4.4f: teams A (user a) and B (users b1, b2 of equal weight) share the nodes by ``team_weights``."""
    hfs = HierarchicalFairShare(list(nodes))
    team_a, team_b = (hfs.create_team(t, w) for t, w in zip(("team-a", "team-b"), team_weights))
    resources = {"a": team_a.create_user("a"), "b1": team_b.create_user("b1"), "b2": team_b.create_user("b2")}
    esl.apply(hfs.on_round(0.0, {user: jobs for user in resources}))  # demand: nodes' worth of queued jobs
    shares = hfs.shares()
    users = {}
    for user, resource in resources.items():
        with gpu_options(gpus=1, resources={resource: 1}):
            users.update({team_job.with_options(name=f"{user}-{i}").submit(user, i, steps): user for i in range(jobs)})
    left, start = {user: jobs for user in resources}, time.time()
    for done in as_completed(list(users)):  # fewer nodes than users: one with work and no node gets some as others end
        left[users[done]] -= 1
        if any(n and not hfs.shares()[u] for u, n in left.items()):
            esl.apply(hfs.on_round(time.time() - start, left))
    esl.apply(hfs.on_round(time.time() - start, {}))  # no demand left: every share is given back
    rows = [f.result() for f in users]
    return {"shares": shares, "jobs": rows, "tasks": rows,
            "metrics": {f"share_{u}_nodes": len(n) for u, n in shares.items()}}


def run_wordcount(nodes: list[str], shards: int, words: int, reducers: int, seed: int, workdir: str,
                  locality: bool) -> dict:
    """One WordCount job (§4.5, Fig. 4.5a): shard ``i`` is written on node ``i mod N``, a mapper per shard,
    ``reducers`` reducers. With ``locality`` the writer marks its node and the mapper requests the mark (the
    paper's two lines); without, a mapper lands wherever the pool places a 1-CPU task and copies its shard over."""
    folder = str(Path(workdir) / ("locality" if locality else "no-locality"))
    writes = []
    for i in range(shards):
        with gpu_options(node=nodes[i % len(nodes)]):  # the input is already spread over the nodes' disks
            writes.append(write_shard.with_options(name=f"write-{i}").submit(i, words, seed, folder, locality))
    written = [f.result() for f in writes]
    started = time.time()
    maps = []
    for w in written:
        need = {f"data-shard-{w['shard']}": 1} if locality else {}  # the mapper's line
        with gpu_options(cpus=1, resources=need):
            maps.append(map_shard.with_options(name=f"map-{w['shard']}").submit(w["shard"], w["node"], folder,
                                                                                 reducers))
    mapped = [f.result() for f in maps]
    reduces = [reduce_partition.with_options(name=f"reduce-{r}").submit(r, [m["partitions"][r] for m in mapped])
               for r in range(reducers)]
    reduced = [f.result() for f in reduces]
    makespan = time.time() - started
    counts: dict[str, int] = {}
    for r in reduced:
        counts.update(r.pop("counts"))
    moved, total = sum(m["transfer_bytes"] for m in mapped), sum(m["input_bytes"] for m in mapped)
    return {"written": written, "maps": mapped, "reduces": reduced, "counts": counts, "makespan_s": makespan,
            "transfer_bytes": moved, "input_bytes": total, "transfer_share": moved / total}


def run_locality(esl: Escher, nodes: list[str], shards: int, words: int, reducers: int, seed: int,
                 workdir: str) -> dict:
    """WordCount without and with the data-locality ESL; the marks are deleted once the job is done."""
    plain = run_wordcount(nodes, shards, words, reducers, seed, workdir, locality=False)
    local = run_wordcount(nodes, shards, words, reducers, seed, workdir, locality=True)
    for w in local["written"]:
        esl.delete_resource(f"data-shard-{w['shard']}", w["node"])
    tasks = [{**row, "task": f"{label}-{row['task']}"} for label, run in (("plain", plain), ("local", local))
             for row in run["written"] + run["maps"] + run["reduces"]]
    return {"no_locality": plain, "locality": local, "tasks": tasks,
            "metrics": {f"{label}_{k}": run[k] for label, run in (("no_locality", plain), ("locality", local))
                        for k in ("makespan_s", "transfer_bytes", "transfer_share")}}


def run_colocation(esl: Escher, pairs: int, rounds: int, seed: int, workdir: str) -> dict:
    """AlphaZero (§4.5, Fig. 4.6a): predictors load-balanced one per node (``anti-predictors``), each aggregator
    requesting ``coloc-predictor-<i>``, which its predictor creates on its node when it starts."""
    spread = anti_affinity(esl, "predictors")
    futures = []
    for i in range(pairs):
        with gpu_options(gpus=0.25, resources=spread):
            made = predictor.with_options(name=f"predictor-{i}").submit(i, rounds, workdir)
        with gpu_options(cpus=1, resources=with_task(f"predictor-{i}")):
            futures.append((made, board_aggregator.with_options(name=f"aggregator-{i}").submit(
                i, rounds, MOVES, workdir, seed)))
    rows = [(p.result(), a.result()) for p, a in futures]
    esl.delete_resource("anti-predictors", EVERY_NODE)
    for p, _ in rows:
        esl.delete_resource(f"coloc-predictor-{p['pair']}", p["node"])
    latencies = sorted(a["exploration_p50_ms"] for _, a in rows)
    return {"pairs": [{"predictor": p, "aggregator": a} for p, a in rows], "tasks": [t for pair in rows for t in pair],
            "metrics": {"pairs": pairs, "colocated_pairs": sum(p["node"] == a["node"] for p, a in rows),
                        "exploration_p50_ms": latencies[len(latencies) // 2]}}


def migration_target(status: dict[str, dict[str, tuple[float, float]]], current: str) -> str | None:
    """EscherTune's trigger (§4.5): another node with an idle GPU, where the trial's workers fit together."""
    return next((n for n, res in sorted(status.items()) if n != current and res.get("GPU", (0, 0))[1] >= 1), None)


def migrate_trial(esl: Escher, trial: str, node: str) -> None:
    """EscherTune's migration (§4.5, Fig. 4.6c): after the trial's checkpoint, ``trial-<id>`` moves to ``node``;
    the relaunched workers keep their requests and so land there."""
    esl.delete_resource(f"trial-{trial}", EVERY_NODE)
    esl.set_resource(f"trial-{trial}", 1, node)


def run_tune(esl: Escher, nodes: list[str], steps: int, workdir: str) -> dict:
    """One trial, two chunks: train and checkpoint on the first node, migrate, resume on the node chosen."""
    trial, checkpoint = "long", str(Path(workdir) / "trial-long.pt")
    request = {"gpus": 0.5, "resources": {f"trial-{trial}": 1}}
    esl.set_resource(f"trial-{trial}", 1, nodes[0])
    with gpu_options(**request):
        before = trial_chunk.with_options(name=f"trial-{trial}-0").submit(trial, steps, checkpoint).result()
    target = migration_target(esl.get_cluster_status(), before["node"])
    if target is None:
        raise RuntimeError(f"EscherTune: no node but {before['node']} has an idle GPU for trial-{trial} to move to")
    migrate_trial(esl, trial, target)
    with gpu_options(**request):
        after = trial_chunk.with_options(name=f"trial-{trial}-1").submit(trial, steps, checkpoint).result()
    esl.delete_resource(f"trial-{trial}", target)
    return {"before": before, "after": after, "tasks": [before, after],
            "metrics": {"resumed_step": after["first_step"], "loss_at_checkpoint": before["final_loss"],
                        "loss_on_resume": after["losses"][0], "final_loss": after["final_loss"]}}


DEMOS: dict[str, Demo] = {
    "affinity": Demo("anti-affinity-affinity", (anti_affinity, colocate, with_task)),
    "gang": Demo("gang", (AppSpaceGang,), "78 (AppSpace; LibSpace 261, FrameSpace 1624)"),
    "hfs": Demo("hfs", (HierarchicalFairShare, water_fill)),
    "locality": Demo("wordcount", (store_data,), "2"),
    "colocation": Demo("alphazero", (anti_affinity, colocate, with_task), "5"),
    "tune": Demo("eschertune", (migration_target, migrate_trial), "50"),
}
POLICIES = tuple(DEMOS)


def _run_policy(name: str, ledger, esl: Escher, nodes: list[str], s: Settings, workdir: str) -> dict:
    """Run one policy's demo (the dispatch is a table: each entry says which settings it reads)."""
    demos: dict[str, Callable[[], dict]] = {
        "affinity": lambda: run_placement(esl, s.steps),
        "gang": lambda: run_gang(ledger, esl, s.gang_size, s.steps, s.gang_timeout_s, s.seed, workdir),
        "hfs": lambda: run_hfs(esl, nodes, s.team_weights, s.jobs, s.steps),
        "locality": lambda: run_locality(esl, nodes, s.shards, s.words, s.reducers, s.seed, workdir),
        "colocation": lambda: run_colocation(esl, s.pairs, s.rounds, s.seed, workdir),
        "tune": lambda: run_tune(esl, nodes, s.steps, workdir),
    }
    return demos[name]()


# -- choosing and checking ------------------------------------------------------------------------
def policy_block(policy: SchedulerPolicy | str | dict) -> SchedulerPolicy:
    """A ``policy`` parameter as a SchedulerPolicy: the block, a saved block's name, or its fields (API)."""
    if isinstance(policy, SchedulerPolicy):
        return policy
    if isinstance(policy, dict):
        try:
            return SchedulerPolicy(**policy)
        except ValueError as exc:
            raise ConfigError("policy", policy, str(exc).splitlines()[-1]) from exc
    return SchedulerPolicy.load_or_default(policy)


def choose(policies: list[str] | None, policy: SchedulerPolicy | str | dict | None,
           params: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The policies to run, and the flow's parameters with a SchedulerPolicy's ``params`` applied over them.

    ``SchedulerPolicy(system="escher", policy="locality", params={"shards": 4})`` runs WordCount alone on 4
    shards; without a block, ``policies`` names the demos (default: all of ``POLICIES``)."""
    if policy is not None:
        block = policy_block(policy)
        if block.system != "escher":
            raise ConfigError("policy.system", block.system, "this flow runs ESCHER's policies: system='escher'")
        if block.policy not in DEMOS:
            raise ConfigError("policy.policy", block.policy, f"the flow runs {POLICIES}")
        unknown = sorted(set(block.params) - {f.name for f in fields(Settings)})
        if unknown:
            raise ConfigError("policy.params", unknown, f"not a flow parameter; choose from "
                                                         f"{[f.name for f in fields(Settings)]}")
        if policies is not None and list(policies) != [block.policy]:
            raise ConfigError("policies", policies, f"the policy block already chose {block.policy!r}")
        return (block.policy,), {**params, **block.params}
    names = POLICIES if policies is None else policies
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not names:
        raise ConfigError("policies", names, f"give a non-empty list of {POLICIES}")
    for name in names:
        if name not in DEMOS:
            raise ConfigError("policies", name, f"unknown policy; choose from {POLICIES}")
    return tuple(dict.fromkeys(names)), params


def check_settings(params: dict[str, Any], nodes: int) -> Settings:
    """The policies' settings, every value checked (ConfigError naming the field)."""
    integer(params["gang_size"], "gang_size", minimum=1)
    if params["gang_size"] > nodes:
        raise ConfigError("gang_size", params["gang_size"], f"its ghosts are spread one per node; the pool has {nodes}")
    positive(params["gang_timeout_s"], "gang_timeout_s")
    weights = params["team_weights"]
    if not isinstance(weights, (list, tuple)) or len(weights) != 2:
        raise ConfigError("team_weights", weights, "give the two teams' weights, e.g. [1, 1]")
    for i, w in enumerate(weights):
        positive(w, f"team_weights[{i}]")
    for name in ("jobs", "steps", "shards", "words", "reducers", "pairs", "rounds"):
        integer(params[name], name, minimum=1)
    if params["pairs"] > nodes:
        raise ConfigError("pairs", params["pairs"], f"predictors are load-balanced one per node; the pool has {nodes}")
    integer(params["seed"], "seed", minimum=0)
    return Settings(**{**{f.name: params[f.name] for f in fields(Settings)}, "team_weights": tuple(weights)})


def runner_settings(parameters: dict) -> dict:
    """The flow's GPU task runner from its own parameters (``pool``, ``mode``, ``tracking``). In process mode the
    runner keeps one worker pool per set of visible devices, and every simulated node's GPU is device 0: the
    pool needs a worker for each task that must run at once (a gang's members, AlphaZero's predictors)."""
    try:
        _, params = choose(parameters.get("policies"), parameters.get("policy"), parameters)
        together = max(2, int(params["gang_size"]), int(params["pairs"]))
    except (GpuflowsError, ValueError, TypeError):  # bad input: prepare() reports it before any task is placed
        together = 2
    return settings(parameters, DEFAULT_POOL, "gpuflows-escher", workers_per_device_set=together)


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
    return block, tracking_target(tracking, "gpuflows-escher"), chosen, check_settings(params, block.nodes)


# -- the flow -------------------------------------------------------------------------------------
def _logged_calls(log_path: str, policy: str) -> list[dict]:
    if not os.path.exists(log_path):
        return []
    with open(log_path) as f:
        return [{"call": "set_resource", **{k: v for k, v in json.loads(line).items() if k != "spec"},
                 "by": f"{policy} ESL"}
                for line in f if line.strip()]


@flow(name="escher-policies", log_prints=True, task_runner=GpuTaskRunner(configure=runner_settings))
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
        jobs: tasks per HFS user; steps: SGD steps per task (per EscherTune chunk).
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
    log_flow_inputs("escher", "+".join(chosen), {"policies": ",".join(chosen), "mode": mode, **asdict(s)})
    ledger = flow_runner().ledger()
    nodes = sorted(ledger.cluster_status())
    if len(nodes) < 2:  # a Ray cluster's nodes are known only now
        raise ConfigError("pool.nodes", len(nodes), "anti-affinity and gangs across nodes need at least 2 nodes")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="escher-") as workdir:
        for name in chosen:
            log_path = os.path.join(workdir, f"{name}.jsonl")
            esl = Escher(ledger, log_path=log_path)
            try:
                out = _run_policy(name, ledger, esl, nodes, s, workdir)
            finally:  # a demo that failed half-way leaves none of its ESL's resources on the pool
                for call in esl.logged():
                    esl.delete_resource(call.name, call.node)
            out["actions"] = (_logged_calls(log_path, name) + out.get("actions", [])
                              + [call for row in out["tasks"] for call in row.pop("set_resource", [])])
            out["esl_lines"] = source_lines(*DEMOS[name].esl)
            results[name] = out
    actions = [a for out in results.values() for a in out["actions"]]
    publish_table("escher-actions", actions, "ESCHER: every set_resource / lease_resource call the ESLs made")
    errors = log_policy_runs(results, DEMOS)
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
        lines.append("HFS shares: " + ", ".join(f"{u} {n}" for u, n in out["hfs"]["shares"].items()))
    if "locality" in out:
        for label in ("no_locality", "locality"):
            w = out["locality"][label]
            lines.append(f"WordCount {label.replace('_', '-')}: makespan {w['makespan_s']:.2f} s, "
                         f"transfer {w['transfer_bytes']} of {w['input_bytes']} bytes ({w['transfer_share']:.1%})")
    if "colocation" in out:
        lines.append("AlphaZero: " + ", ".join(f"predictor-{i} {p['predictor']['node']} / aggregator "
                                               f"{p['aggregator']['node']}" for i, p in enumerate(out["colocation"]["pairs"])))
    if "tune" in out:
        t = out["tune"]
        lines.append(f"EscherTune: trial on {t['before']['node']} steps 0-{t['before']['last_step']} "
                     f"(loss {t['before']['final_loss']:.4f}), migrated to {t['after']['node']}, resumed at step "
                     f"{t['after']['first_step']} (loss {t['after']['losses'][0]:.4f})")
    for name in out["policies"]:
        paper = DEMOS[name].paper_lines
        lines.append(f"lines of code, {DEMOS[name].run_name}: {out[name]['esl_lines']}"
                     + (f" (paper: {paper})" if paper else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.escher_policies", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
        integer(args.nodes, "nodes", minimum=2)
        if args.backend == "ray" and not args.ray_address:
            raise ConfigError("ray_address", None, "--backend ray needs a cluster of 2 or more nodes (a local Ray has one)")
        pool = GpuPool(name=args.pool, device_backend="simulated", simulated="1x16GiB", nodes=args.nodes,
                       ray_address=args.ray_address)
        pool.open_ledger().close()  # the pool name and its layout, checked
        kwargs["pool"], kwargs["tracking"], _, _ = prepare(pool, **kwargs)
        policies = escher_policies
        if args.backend == "ray":  # the same flow and parameters, its tasks on the cluster's nodes
            from tasks.ray_runner import GpuRayTaskRunner

            policies = escher_policies.with_options(task_runner=GpuRayTaskRunner(configure=runner_settings))
        out = policies(**kwargs)
    except GpuflowsError as exc:
        return error(exc)
    print("\n".join(report(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
