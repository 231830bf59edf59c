"""ESCHER policies on real Prefect tasks: gang, affinity, anti-affinity and hierarchical fair sharing written
only as ``set_resource`` calls plus resource requests (Bhardwaj, ESCHER, thesis ch. 4, Table 4.2).

Every task is a small torch job run by ``GpuTaskRunner`` on a pool of several simulated nodes; no policy code
lives in the runner or the ledger. The flow is the ESLs' world: it drives the engine's ESLs
(``gpu.schedulers.escher.api*``) with its real clock and applies their decisions on the pool ledger.

1. Anti-affinity + affinity (Table 4.2, P3 and P1): two serving replicas request ``anti-replicas`` (capacity 1
   per node), so they run on distinct nodes; a producer task creates ``coloc-producer`` on its own node from
   inside the task (``node_spec=None``), and a consumer submitted beside it waits for that resource and lands
   on the producer's node.
2. Gang (§4.4e, AppSpace): ``AppSpaceGang`` asks for one GPU *ghost* per member (spread by anti-affinity), each
   ghost backs a unit of ``gang-<g>`` on its node (``lease_resource``, P4), and the members, requesting only
   ``{gang-<g>: 1}``, start together on the ghosts' devices and train one data-parallel model, averaging
   gradients every step (they would wait forever for each other without the gang). Ghosts not all held within
   the timeout are rolled back and retried after jittered back-off.
3. Hierarchical fair sharing (§4.4f): ``HierarchicalFairShare`` over the pool's nodes with two teams; team A
   has one user, team B two. Each user's tasks request ``res-<user>`` and run only on its share's nodes.

MLflow: experiment ``gpuflows-escher`` (each task's node and devices, the shares, gang latency); Prefect
table artifact ``escher-actions``: every ``set_resource`` the ESLs made.

    python -m flows.escher_policies --nodes 4 --gang-size 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.futures import as_completed

from gpu.errors import AllocationTimeout, ConfigError, GpuflowsError
from gpu.placement import ResourceRequest
from gpu.schedulers.escher.api import Escher, NodeSpec
from gpu.schedulers.escher.gang import AppSpaceGang, Gang
from gpu.schedulers.escher.hfs import HierarchicalFairShare
from gpu.schedulers.escher.primitives import anti_affinity, colocate, with_task
from gpu.scenario import integer, positive
from gpuflows.args import error
from resource_blocks import GpuPool, MlflowTarget
from tasks.flow_runtime import (flow_runner, log_flow_inputs, log_flow_outcome, pool_block, publish_mlflow_link,
                                settings, tracking_target)
from tasks.requests import current_placement, gpu_options, task_ledger
from tasks.runners import GpuTaskRunner
from tasks.ui import publish_table

MODES = ("thread", "process")
BACKENDS = ("local", "ray")
DEFAULT_POOL = GpuPool(name="escher", device_backend="simulated", simulated="1x16GiB", nodes=4)
PROCESS_WORKERS = 2  # the runner's workers per set of visible devices: a gang larger than this cannot all start
BARRIER_TIMEOUT_S = 60.0
EVERY_NODE = NodeSpec()


# -- the tasks: small torch jobs reporting where they ran ------------------------------------------
def _where(started: float) -> dict[str, Any]:
    p = current_placement()
    return {"node": p.placement.node, "devices": list(p.gpu_indices), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "started": started, "ended": time.time()}


def _digits(shard: int = 0, shards: int = 1):
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.tensor(x[shard::shards] / 16.0, dtype=torch.float32), torch.tensor(y[shard::shards])


def _train(steps: int, seed: int, shard: int = 0, shards: int = 1, average=None) -> float:
    """``steps`` SGD steps of a linear digits classifier on this shard; ``average`` all-reduces the gradients."""
    import torch

    torch.set_num_threads(1)
    x, y = _digits(shard, shards)
    model = torch.nn.Linear(64, 10)
    rng = torch.Generator().manual_seed(seed)  # not the global RNG: thread-mode tasks share it
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.01 * torch.randn(param.shape, generator=rng))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if average is not None:
            for i, param in enumerate(model.parameters()):
                param.grad = average(f"{step}-{i}", param.grad)
        opt.step()
    return float(sum(p.detach().double().sum() for p in model.parameters()))


@task
def replica(name: str, steps: int) -> dict:
    """A serving replica warming up its model (anti-affine with the other replicas)."""
    started = time.time()
    return {"task": name, "checksum": _train(steps, 0), **_where(started)}


@task
def producer(steps: int) -> dict:
    """Trains a model and, from inside the task, makes its own node attractive to its consumers (P1)."""
    started = time.time()
    checksum = _train(steps, 1)
    colocate(Escher(task_ledger(), caller_node=current_placement().placement.node), "producer")
    return {"task": "producer", "checksum": checksum, **_where(started)}


@task
def consumer(steps: int) -> dict:
    """Runs where the producer ran (its model would be read from that node's memory)."""
    started = time.time()
    return {"task": "consumer", "checksum": _train(steps, 2), **_where(started)}


@task
def gang_member(rank: int, world: int, steps: int, rendezvous: str) -> dict:
    """One data-parallel worker: its shard of digits, gradients averaged with every other member each step
    through files in ``rendezvous`` (a synchronous all-reduce: it only finishes if all members run at once)."""
    import torch

    started = time.time()
    folder = Path(rendezvous)

    def average(key: str, grad):
        mine = folder / f"{key}-{rank}.pt"
        torch.save(grad, mine.with_suffix(".tmp"))
        mine.with_suffix(".tmp").rename(mine)
        theirs = [folder / f"{key}-{r}.pt" for r in range(world)]
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while not all(p.exists() for p in theirs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gang member {rank}: the others never reached step {key}")
            time.sleep(0.002)
        return torch.stack([torch.load(p) for p in theirs]).mean(0)

    checksum = _train(steps, 3, rank, world, average)
    return {"task": f"member-{rank}", "checksum": checksum, **_where(started)}


@task
def team_job(user: str, i: int, steps: int) -> dict:
    started = time.time()
    return {"task": f"{user}-{i}", "user": user, "checksum": _train(steps, 4 + i), **_where(started)}


# -- the ESLs' world ------------------------------------------------------------------------------
def run_gang(ledger, esl: Escher, size: int, steps: int, timeout_s: float, seed: int) -> dict:
    """AppSpace gang (§4.4e) driven with the real clock: ghosts → ``gang-<g>`` per ghost's node → members."""
    spread = anti_affinity(esl, "gang-ghosts")
    gang = Gang("dp", tuple(ResourceRequest(gpus=1, resources=spread) for _ in range(size)))
    controller = AppSpaceGang(gang, timeout=timeout_s, seed=seed)
    arrived = time.time()
    step = controller.on_arrival(0.0)
    while True:
        ghosts: list = []
        try:
            for i in step.submit:
                left = max(0.0, arrived + step.wake_at - time.time()) if step.wake_at is not None else None
                ghost = ledger.allocate(gang.ghost(i), timeout=left)
                ghosts.append(ghost)
                decided = controller.on_ghost_started(time.time() - arrived, i, ghost.node)
                # the decided gang-<g> unit, backed by the ghost so the member inherits its devices (P4)
                ledger.lease_resource(ghost.lease_id, gang.resource, 1)
            break
        except BaseException as exc:
            for ghost in ghosts:  # roll back: the ghosts' gang-<g> units die with their leases
                ledger.release(ghost.lease_id)
            if not isinstance(exc, AllocationTimeout):
                raise
            back_off = controller.on_timer(time.time() - arrived)
            time.sleep(max(0.0, back_off.wake_at - (time.time() - arrived)))
            step = controller.on_retry(time.time() - arrived)
    launched = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="escher-gang-") as rendezvous:
            futures = []
            for i, member in enumerate(decided.launch):
                with gpu_options(resources=dict(member.resources)):
                    futures.append(gang_member.with_options(name=member.label).submit(i, size, steps, rendezvous))
            members = [f.result() for f in futures]
    finally:
        for ghost in ghosts:
            ledger.release(ghost.lease_id)
        esl.delete_resource("anti-gang-ghosts", EVERY_NODE)
    return {"members": members, "ghosts": [{"node": g.node, "devices": list(g.devices)} for g in ghosts],
            "attempts": controller.attempts, "gang_latency_s": launched - arrived,
            "actions": [{"esl": "gang", "call": "lease_resource", "name": gang.resource, "capacity": 1.0,
                         "node": g.node} for g in ghosts]}


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
    return out


def run_hfs(esl: Escher, nodes: list[str], team_weights: list[float], jobs: int, steps: int) -> dict:
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
    return {"shares": shares, "jobs": [f.result() for f in users]}


def runner_settings(parameters: dict) -> dict:
    """The flow's GPU task runner from its own parameters (``pool``, ``mode``, ``tracking``)."""
    return settings(parameters, DEFAULT_POOL, "gpuflows-escher")


def prepare(pool: GpuPool | str | dict | None, tracking: MlflowTarget | bool | str | None, *, gang_size: int,
            gang_timeout_s: float, team_weights: list[float], jobs: int, steps: int, mode: str, seed: int,
            **_: Any) -> tuple[GpuPool, MlflowTarget]:
    """The flow's pool and MLflow target, every parameter checked: the flow calls it for deployment runs,
    ``main`` before the flow, so a bad argument fails before a flow run starts."""
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    block = pool_block(pool, DEFAULT_POOL)
    if block.nodes < 2:
        raise ConfigError("pool.nodes", block.nodes, "anti-affinity and gangs across nodes need at least 2 nodes")
    integer(gang_size, "gang_size", minimum=1)
    if gang_size > block.nodes:
        raise ConfigError("gang_size", gang_size, f"its ghosts are spread one per node; the pool has {block.nodes}")
    if mode == "process" and gang_size > PROCESS_WORKERS:
        raise ConfigError("gang_size", gang_size, f"process mode runs at most {PROCESS_WORKERS} tasks per device "
                                                  "set at once, and a gang's members must all run together")
    positive(gang_timeout_s, "gang_timeout_s")
    if not isinstance(team_weights, (list, tuple)) or len(team_weights) != 2:
        raise ConfigError("team_weights", team_weights, "give the two teams' weights, e.g. [1, 1]")
    for i, w in enumerate(team_weights):
        positive(w, f"team_weights[{i}]")
    integer(jobs, "jobs", minimum=1)
    integer(steps, "steps", minimum=1)
    integer(seed, "seed", minimum=0)
    return block, tracking_target(tracking, "gpuflows-escher")


@flow(name="escher-policies", log_prints=True, task_runner=GpuTaskRunner(configure=runner_settings))
def escher_policies(gang_size: int = 2, gang_timeout_s: float = 30.0, team_weights: list[float] | None = None,
                    jobs: int = 2, steps: int = 30, seed: int = 0, pool: GpuPool | str | None = None,
                    mode: str = "thread", tracking: MlflowTarget | bool | str | None = None) -> dict:
    """Run the ESCHER policies on real tasks; return where every task ran, the shares and the ESL actions.

    Args:
        gang_size: members of the data-parallel gang (one GPU ghost each, one per node).
        gang_timeout_s: AppSpace's timeout for all ghosts to start before a rollback.
        team_weights: HFS weights of team A and team B (default [1, 1]).
        jobs: tasks per HFS user; steps: SGD steps per task.
        seed: the gang's back-off jitter.
        pool: GpuPool block, saved block name, or None (pool "escher": 4 simulated nodes of one 16 GiB GPU).
        mode: "thread" (default: simulated nodes share this machine) or "process".
        tracking: MlflowTarget block, saved block name, False, or None for the default target.
    """
    team_weights = [1.0, 1.0] if team_weights is None else team_weights
    prepare(pool, tracking, gang_size=gang_size, gang_timeout_s=gang_timeout_s, team_weights=team_weights,
            jobs=jobs, steps=steps, mode=mode, seed=seed)
    publish_mlflow_link()
    log_flow_inputs("escher", "policies", {"gang_size": gang_size, "gang_timeout_s": gang_timeout_s,
                                           "team_weights": team_weights, "jobs": jobs, "steps": steps, "mode": mode})
    ledger = flow_runner().ledger()
    nodes = sorted(ledger.cluster_status())
    if len(nodes) < 2:  # a Ray cluster's nodes are known only now
        raise ConfigError("pool.nodes", len(nodes), "anti-affinity and gangs across nodes need at least 2 nodes")
    with tempfile.TemporaryDirectory(prefix="escher-log-") as folder:
        log_path = os.path.join(folder, "set_resource.jsonl")
        esl = Escher(ledger, log_path=log_path)
        placement = run_placement(esl, steps)
        gang = run_gang(ledger, esl, gang_size, steps, gang_timeout_s, seed)
        hfs = run_hfs(esl, nodes, team_weights, jobs, steps)
        with open(log_path) as f:
            actions = [{"esl": "escher", "call": "set_resource", **json.loads(line)} for line in f if line.strip()]
    actions += gang.pop("actions")
    for row in actions:
        row.pop("spec", None)
    publish_table("escher-actions", actions, "ESCHER: every set_resource / lease_resource call the ESLs made")
    log_flow_outcome({"gang_latency_s": gang["gang_latency_s"], "gang_attempts": gang["attempts"],
                      **{f"share_{u}_nodes": len(n) for u, n in hfs["shares"].items()}})
    return {"nodes": nodes, "placement": placement, "gang": gang, "hfs": hfs, "actions": actions}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.escher_policies", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes of the pool (default 4)")
    parser.add_argument("--pool", default="escher", help="pool name (flows naming the same pool share it)")
    parser.add_argument("--gang-size", type=int, default=2, help="data-parallel gang members (default 2)")
    parser.add_argument("--gang-timeout-s", type=float, default=30.0, help="AppSpace ghost timeout (default 30)")
    parser.add_argument("--team-weights", type=float, nargs=2, default=[1.0, 1.0], metavar=("A", "B"),
                        help="HFS weights of the two teams (default 1 1)")
    parser.add_argument("--jobs", type=int, default=2, help="tasks per HFS user (default 2)")
    parser.add_argument("--steps", type=int, default=30, help="SGD steps per task (default 30)")
    parser.add_argument("--mode", default="thread", help=f"runner mode, one of {MODES} (default thread)")
    parser.add_argument("--no-tracking", action="store_true", help="switch MLflow tracking off")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="tasks on simulated nodes here (local) or on a Ray cluster's nodes (ray: needs --ray-address)")
    parser.add_argument("--ray-address", default=None, help="the Ray cluster (ip:port) for --backend ray")
    args = parser.parse_args(argv)
    kwargs = dict(gang_size=args.gang_size, gang_timeout_s=args.gang_timeout_s, team_weights=args.team_weights,
                  jobs=args.jobs, steps=args.steps, seed=0, mode=args.mode,
                  tracking=False if args.no_tracking else None)
    try:  # before a Prefect server starts
        integer(args.nodes, "nodes", minimum=2)
        if args.backend == "ray" and not args.ray_address:
            raise ConfigError("ray_address", None, "--backend ray needs a cluster of 2 or more nodes (a local Ray has one)")
        pool = GpuPool(name=args.pool, device_backend="simulated", simulated="1x16GiB", nodes=args.nodes,
                       ray_address=args.ray_address)
        pool.open_ledger().close()  # the pool name and its layout, checked
        kwargs["pool"], kwargs["tracking"] = prepare(pool, **kwargs)
        policies = escher_policies
        if args.backend == "ray":  # the same flow and parameters, its tasks on the cluster's nodes
            from tasks.ray_runner import GpuRayTaskRunner

            policies = escher_policies.with_options(task_runner=GpuRayTaskRunner(configure=runner_settings))
        out = policies(**kwargs)
    except GpuflowsError as exc:
        return error(exc)
    p = out["placement"]
    print("anti-affinity: replicas on " + ", ".join(r["node"] for r in p["replicas"]))
    print(f"affinity: producer on {p['producer']['node']}, consumer on {p['consumer']['node']}")
    g = out["gang"]
    print(f"gang: {len(g['members'])} members on " + ", ".join(f"{m['node']} gpu{m['devices']}" for m in g["members"])
          + f" after {g['gang_latency_s']:.2f} s ({g['attempts']} attempt(s))")
    print("HFS shares: " + ", ".join(f"{u} {n}" for u, n in out["hfs"]["shares"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
