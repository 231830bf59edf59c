"""ESCHER's application experiments in simulation (thesis §4.6): WordCount locality (Fig. 4.5a/b),
hierarchical fair sharing (Fig. 4.5c), AlphaZero co-location (Fig. 4.6b), EscherTune migration
(Fig. 4.6c). Each runs real ESL calls on a ``World``; what the paper measured on EC2 but a simulator
cannot know (network bandwidth, a model's warm-up, spread-training slowdown) is a calibrated input,
reported as such.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from gpu.devices import simulated_nodes
from gpu.placement import FifoBestFit, ResourceRequest
from gpu.schedulers.escher.api import Escher
from gpu.schedulers.escher.hfs import FairShareMonitor, HierarchicalFairShare
from gpu.schedulers.escher.primitives import ElasticLoadBalancer, colocate, store_data, with_task
from gpu.schedulers.escher.tune import TrialProgress, consolidation, spread_by_availability, trial_resources
from gpu.sim.escher.world import Timing, World

TRANSFER_SHARE = 0.583   # Fig. 4.5a: no-locality transfer share of job time at 500 GB


# -- WordCount (Fig. 4.5a/b) -----------------------------------------------------------------------
@dataclass(frozen=True)
class WordCount:
    """Fig. 4.5a/b's WordCount: ``compute_s_per_gb`` a mapper's counting cost, ``bandwidth_gb_s`` a chunk's transfer
    rate from another node; None calibrates it (``bandwidth``): what a simulator cannot know unless it is measured
    (``benchmarks/escher.py`` measures both on this machine with the flow's own mapper code)."""

    nodes: int = 100
    input_gb: tuple[float, ...] = (50, 100, 200, 300, 400, 500)
    cluster_sizes: tuple[int, ...] = (25, 50, 100, 200)
    compute_s_per_gb: float = 2.0
    bandwidth_gb_s: float | None = None


def link_bandwidth(load: WordCount, nodes: int) -> float:
    """The transfer rate of a run on ``nodes`` nodes: the measured one, else the calibrated one."""
    return load.bandwidth_gb_s if load.bandwidth_gb_s is not None else bandwidth(load, nodes)


def bandwidth(load: WordCount, nodes: int) -> float:
    """Calibration: the GB/s that makes transfer ``TRANSFER_SHARE`` of job time without locality, at the largest
    input (true by construction: used only when no bandwidth was measured)."""
    chunk = max(load.input_gb) / nodes
    compute = load.compute_s_per_gb * chunk
    remote = (nodes - 1) / nodes
    transfer = TRANSFER_SHARE * compute / (remote * (1 - TRANSFER_SHARE))
    return chunk / transfer


def wordcount(load: WordCount, placement: str, input_gb: float, nodes: int, bandwidth: float,
              timing: Timing, seed: int) -> dict[str, float]:
    """One WordCount map phase: a chunk per node, one mapper per chunk, one mapper at a time per node.

    ``placement``: ``random`` (locality-unaware), ``native`` (the scheduler's own locality: the mapper
    pinned to its chunk's node) or ``escher`` (the writer's ``set_resource("data-<i>")`` and the mapper's
    ``{"data-<i>": 1}``, the paper's two lines).
    """
    world = World(simulated_nodes("0x1GiB", nodes, cpus=1), FifoBestFit(backfill=True), timing, seed)
    rng = np.random.default_rng(seed + 7)
    chunk = input_gb / nodes
    done = {"transfer": 0.0, "compute": 0.0, "end": 0.0}

    def mapper_time(home: str):
        def duration(p) -> float:
            compute = load.compute_s_per_gb * chunk
            transfer = 0.0 if p.node == home else chunk / bandwidth
            done["transfer"] += transfer
            done["compute"] += compute
            return compute + transfer
        return duration

    def ended(p) -> None:
        done["end"] = max(done["end"], world.now)

    for i in range(nodes):
        home = f"node{i}"
        if placement == "escher":
            def write(i=i, home=home) -> None:                    # the chunk's writer, on its node
                esl = Escher(world.ledger, caller_node=home)
                need = store_data(esl, f"chunk{i}")               # line 1
                world.run_task(ResourceRequest(cpus=1, resources=need), mapper_time(home), on_end=ended)   # line 2
            world.loop.after(timing.set_resource, write)
        else:
            node = home if placement == "native" else f"node{int(rng.integers(nodes))}"
            world.run_task(ResourceRequest(cpus=1, node=node), mapper_time(home), on_end=ended)
    world.loop.run()
    return {"makespan_s": done["end"], "transfer_share": done["transfer"] / (done["transfer"] + done["compute"])}


# -- HFS (Fig. 4.5c) ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FairShare:
    nodes: int = 100
    task_s: float = 10.0            # mean; each task draws uniformly in [0.5, 1.5] x this
    warmup_s: float = 8.0           # B's first task on a node also loads its model (the t=60 dip)
    period_s: float = 5.0
    horizon_s: float = 180.0
    arrivals: tuple[tuple[str, str, float, float], ...] = (("A", "org1", 2.0, 0.0), ("B", "org1", 3.0, 60.0),
                                                           ("C", "org2", 1.0, 120.0))


QUEUED, BACKLOG = 5, 10_000
"""Tasks each user keeps queued, and the unbounded backlog it reports to the ESL beyond them (keeping
the whole backlog queued would change nothing but the simulator's cost)."""


def fair_share(load: FairShare, timing: Timing, seed: int) -> list[dict[str, float]]:
    """Users with unbounded backlogs arriving over time under the HFS ESL; samples every second of
    each user's running tasks and the net throughput (the share of nodes running a task past its warm-up)."""
    world = World(simulated_nodes("0x1GiB", load.nodes, cpus=1), FifoBestFit(backfill=True), timing, seed)
    rng = np.random.default_rng(seed + 11)
    root = HierarchicalFairShare(sorted(world.ledger.cluster_status()))
    monitor = FairShareMonitor(root, load.period_s)
    teams: dict[str, HierarchicalFairShare] = {}
    resource: dict[str, str] = {}
    running = {u: 0 for u, *_ in load.arrivals}
    on_node: dict[str, collections.Counter] = {u: collections.Counter() for u in running}
    queued = dict(running)
    warm: set[tuple[str, str]] = set()
    warming = [0]
    samples: list[dict[str, float]] = []

    def submit(user: str) -> None:
        queued[user] += 1

        work = load.task_s * float(rng.uniform(0.5, 1.5))
        warmup = [0.0]

        def start(p) -> None:
            queued[user] -= 1
            running[user] += 1
            on_node[user][p.node] += 1
            if user == "B" and (user, p.node) not in warm:
                warm.add((user, p.node))
                warmup[0] = load.warmup_s
                warming[0] += 1
                world.loop.after(load.warmup_s, lambda: warming.__setitem__(0, warming[0] - 1))
            if world.now < load.horizon_s:
                submit(user)                               # keep the queue topped up

        def end(p) -> None:
            running[user] -= 1
            on_node[user][p.node] -= 1

        world.run_task(ResourceRequest(cpus=1, resources={resource[user]: 1}), lambda p: work + warmup[0], start, end)

    def arrive(user: str, team: str, weight: float) -> None:
        if team not in teams:
            teams[team] = root.create_team(team)
        resource[user] = teams[team].create_user(user, weight)
        for _ in range(QUEUED):
            submit(user)

    def rebalance() -> None:
        demand = {u: running[u] + queued[u] + BACKLOG for u in resource}
        decision = monitor.on_wake(world.now, demand, {u: +on_node[u] for u in resource})
        world.apply(decision.actions)
        if decision.wake_at < load.horizon_s:
            world.loop.at(decision.wake_at, rebalance)

    def sample() -> None:
        samples.append({"t": world.now, **{u: float(running[u]) for u in running},
                        "net_throughput": float(sum(running.values()) - warming[0]) / load.nodes})
        if world.now + 1 <= load.horizon_s:
            world.loop.after(1.0, sample)

    for user, team, weight, t in load.arrivals:
        world.loop.at(t, lambda u=user, tm=team, w=weight: arrive(u, tm, w))
    world.loop.at(0.0, rebalance, priority=1)
    world.loop.at(0.0, sample, priority=2)
    world.loop.run(until=load.horizon_s)
    return samples


# -- AlphaZero (Fig. 4.6b) -------------------------------------------------------------------------
@dataclass(frozen=True)
class AlphaZero:
    nodes: int = 32
    pairs: int = 32
    explorations: int = 300          # board explorations per pair
    compute_ms: float = 10.0         # median predictor + aggregator time of one exploration
    compute_sigma: float = 0.25
    median_gain: float = 0.154       # calibration target: co-location vs none, median latency


def alphazero_placements(load: AlphaZero, placement: str, timing: Timing, seed: int) -> tuple[int, float]:
    """Place ``pairs`` predictor (1 GPU, load-balanced) + aggregator pairs; how many pairs share a node,
    and when the last aggregator ran. ``hardcoded`` pins the aggregator to its predictor's node, ``escher``
    co-locates through the predictor's ``set_resource`` (Fig. 4.6a, five lines), ``none`` load-balances
    the aggregators on their own."""
    world = World(simulated_nodes("4x16GiB", load.nodes, cpus=8), FifoBestFit(backfill=True), timing, seed)
    lb, agg_lb = ElasticLoadBalancer("pred"), ElasticLoadBalancer("agg")
    world.esl.apply(lb.setup(world.ledger.cluster_status()))
    world.esl.apply(agg_lb.setup(world.ledger.cluster_status()))
    homes: dict[int, str] = {}
    together, last = [0], [0.0]

    def aggregator_started(i: int):
        def started(p) -> None:
            together[0] += p.node == homes[i]
            last[0] = max(last[0], world.now)
        return started

    def predictor_started(i: int):
        def started(p) -> None:
            homes[i] = p.node
            if placement == "escher":
                esl = Escher(world.ledger, caller_node=p.node)
                world.loop.after(timing.set_resource, lambda: (
                    colocate(esl, f"pred{i}"),
                    world.run_task(ResourceRequest(cpus=4, resources=with_task(f"pred{i}")), 3600.0, aggregator_started(i))))
            else:
                node = p.node if placement == "hardcoded" else None
                resources = {} if node else agg_lb.requirement
                world.run_task(ResourceRequest(cpus=4, node=node, resources=resources), 3600.0, aggregator_started(i))
                world.esl.apply(agg_lb.on_arrival(world.now, world.ledger.cluster_status(), world.ledger.waiting()))
        return started

    for i in range(load.pairs):
        world.run_task(ResourceRequest(gpus=1, resources=lb.requirement), 3600.0, predictor_started(i))
        world.esl.apply(lb.on_arrival(0.0, world.ledger.cluster_status(), world.ledger.waiting()))
    world.loop.run(until=60.0)
    return together[0], last[0]


def exploration_latencies(load: AlphaZero, colocated: int, penalty_ms: float, seed: int) -> np.ndarray:
    """Per-exploration latency (ms): compute, plus a board transfer for a pair split across nodes."""
    rng = np.random.default_rng(seed)
    n = load.pairs * load.explorations
    compute = load.compute_ms * rng.lognormal(0.0, load.compute_sigma, n)
    split = np.arange(n) // load.explorations >= colocated
    transfer = penalty_ms * rng.lognormal(0.0, 0.5, n)
    return compute + np.where(split, transfer, 0.0)


def calibrate_penalty(load: AlphaZero, colocated_none: int, seed: int) -> float:
    """The transfer penalty (ms) at which co-location cuts the median latency by ``median_gain``."""
    base = np.median(exploration_latencies(load, load.pairs, 0.0, seed))
    lo, hi = 0.0, 10 * load.compute_ms
    for _ in range(40):
        mid = (lo + hi) / 2
        none = np.median(exploration_latencies(load, colocated_none, mid, seed))
        lo, hi = (mid, hi) if 1 - base / none < load.median_gain else (lo, mid)
    return (lo + hi) / 2


# -- EscherTune (Fig. 4.6c) ------------------------------------------------------------------------
@dataclass(frozen=True)
class Tune:
    nodes: int = 3
    gpus_per_node: int = 4
    short_s: tuple[float, ...] = (200.0, 300.0, 120.0, 400.0, 500.0)   # the 5 short 1-GPU jobs
    long_gpus: int = 4
    horizon_s: float = 600.0
    poll_s: float = 5.0
    checkpoint_s: float = 10.0      # checkpoint + relaunch downtime of a migration
    spread_penalty: float = 1.363   # co-located / spread throughput (calibrated to the paper's +36.3 %)


def tune(load: Tune, migrate: bool, timing: Timing, seed: int) -> dict[str, float]:
    """Five load-balanced short jobs, then a ``long_gpus`` job spread where GPUs are free
    (``spread_by_availability``). With ``migrate`` (EscherTune) a monitor asks the flow's ``consolidation`` every
    ``poll_s`` and moves the long job's ``trial-long`` resource onto fewer nodes once they have room for all its
    workers: checkpoint, stop the workers, move the resource, relaunch them with unchanged requests. Throughput of
    the long job: 1 co-located, 1/``spread_penalty`` spread."""
    world = World(simulated_nodes(f"{load.gpus_per_node}x16GiB", load.nodes, cpus=8), FifoBestFit(backfill=True),
                  timing, seed)
    lb = ElasticLoadBalancer("short")
    world.esl.apply(lb.setup(world.ledger.cluster_status()))
    for i, d in enumerate(load.short_s):
        world.run_task(ResourceRequest(gpus=1, resources=lb.requirement, label=f"short{i}"), d)
        world.esl.apply(lb.on_arrival(0.0, world.ledger.cluster_status(), 1))
    workers: dict[str, str] = {}                   # lease id -> node
    state = {"work": 0.0, "since": 0.0, "rate": 0.0, "migrated_at": -1.0, "moving": False}
    nodes = sorted(world.ledger.cluster_status())

    def account() -> None:
        state["work"] += state["rate"] * (world.now - state["since"])
        state["since"] = world.now

    def set_rate() -> None:
        account()
        full = len(workers) == load.long_gpus and not state["moving"]
        state["rate"] = 0.0 if not full else (1.0 if len(set(workers.values())) == 1 else 1 / load.spread_penalty)

    def launch() -> None:
        for _ in range(load.long_gpus):
            world.run_task(ResourceRequest(gpus=1, resources={"trial-long": 1}, label="long"), 1e9, on_start=started)

    def started(p) -> None:
        workers[p.lease_id] = p.node
        set_rate()

    def place() -> None:                            # spread by availability, one trial-long unit per free GPU
        counts = spread_by_availability(world.ledger.free_state(), load.long_gpus, 1.0)
        world.apply(trial_resources("long", counts or (), nodes), then=launch)

    def monitor() -> None:
        account()
        placement = collections.Counter(workers.values())
        # the job runs to the horizon: what it has left is the rest of the run; a move costs its downtime
        rate, left_s = state["rate"], load.horizon_s - world.now
        progress = TrialProgress(int(state["work"]), int(state["work"] + rate * left_s), rate,
                                 load.checkpoint_s) if rate > 0 else None
        decision = consolidation(world.ledger.free_state(), placement, 1.0, progress)
        if migrate and decision and not state["moving"]:
            state["moving"] = True
            set_rate()
            state["migrated_at"] = world.now
            world.loop.after(load.checkpoint_s, lambda: move(decision.counts))
        if world.now + load.poll_s < load.horizon_s:
            world.loop.after(load.poll_s, monitor)

    def move(counts) -> None:
        for lease in list(workers):
            world.release(lease)
        workers.clear()
        state["moving"] = False
        world.apply(trial_resources("long", counts, nodes), then=launch)

    world.loop.at(1.0, place)
    world.loop.at(1.0 + load.poll_s, monitor)
    world.loop.run(until=load.horizon_s)
    account()
    return {"long_work": state["work"], "migrated_at_s": state["migrated_at"],
            "long_nodes_at_end": float(len(set(workers.values()))), "final_rate": state["rate"]}
