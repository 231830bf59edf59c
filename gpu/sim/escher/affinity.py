"""Table 4.2's anti-affinity and affinity rows in simulation (Bhardwaj, ESCHER, thesis §4.4, P3 and P1).

Serving replicas request ``anti-replicas`` (capacity 1 on every node, ``anti_affinity``), so no two share a node;
each producer, once it runs, creates ``coloc-producer-<i>`` on its own node (``colocate``), and its consumer,
queued with the next stage before any producer runs, requests ``with_task("producer-<i>")`` and so waits for that resource and lands
there, waiting for room if best fit has filled that node. The same tasks without the ESL calls (``none``) are
placed by the scheduler alone (best fit), which packs replicas together and puts a consumer wherever it fits. The ESL calls are the ones the flow's ``affinity``
policy makes on real tasks; the paper gives no figure for these rows, so the simulator reports how many tasks
land where the policy says and what the consumers' wait for ``set_resource`` costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu.devices import simulated_nodes
from gpu.placement import FifoBestFit, ResourceRequest
from gpu.schedulers.escher.api import Escher, NodeSpec
from gpu.schedulers.escher.primitives import anti_affinity, colocate, with_task
from gpu.sim.escher.world import Timing, World

PLACEMENTS = ("escher", "none")


@dataclass(frozen=True)
class Affinity:
    """Replicas to spread and producer/consumer pairs to co-locate on ``nodes`` nodes of ``cpus`` CPUs each."""

    nodes: int = 8
    cpus: int = 4
    replicas: int = 4
    pairs: int = 8
    task_s: float = 10.0


def affinity_placements(load: Affinity, placement: str, timing: Timing, seed: int) -> dict[str, float]:
    """Run the replicas and pairs (1 CPU each, ``task_s`` long) with the ESL calls (``escher``) or without
    (``none``). Returns the share of replicas on distinct nodes, the share of consumers on their producer's
    node, the consumers' mean delay behind their producers, and whether anything was left on the ledger."""
    world = World(simulated_nodes("0x1GiB", load.nodes, cpus=load.cpus), FifoBestFit(backfill=True), timing, seed)
    escher = placement == "escher"
    spread = anti_affinity(world.esl, "replicas") if escher else {}
    replica_nodes: list[str] = []
    producers: dict[int, tuple[str, float]] = {}
    consumers: dict[int, tuple[str, float]] = {}

    def producer_started(i: int):
        def started(p) -> None:
            producers[i] = (p.node, world.now)
            if escher:  # the producer's own call: its node becomes the pair's (P1)
                esl = Escher(world.ledger, caller_node=p.node)
                world.loop.after(timing.set_resource, lambda: colocate(esl, f"producer-{i}"))
        return started

    def consumer_started(i: int):
        return lambda p: consumers.__setitem__(i, (p.node, world.now))

    for _ in range(load.replicas):
        world.run_task(ResourceRequest(cpus=1, resources=spread), load.task_s, lambda p: replica_nodes.append(p.node))
    for i in range(load.pairs):  # a stage of producers, then (queued at once, before any runs) their consumers
        world.run_task(ResourceRequest(cpus=1), load.task_s, producer_started(i))
    for i in range(load.pairs):
        world.run_task(ResourceRequest(cpus=1, resources=with_task(f"producer-{i}") if escher else {}),
                       load.task_s, consumer_started(i))
    world.loop.run()
    for name in ["anti-replicas", *(f"coloc-producer-{i}" for i in range(load.pairs))] if escher else []:
        world.esl.delete_resource(name, NodeSpec())
    left = bool(world.ledger.leases()) or any(set(r) - {"CPU", "GPU"} for r in world.ledger.cluster_status().values())
    return {"replica_spread": len(set(replica_nodes)) / load.replicas,
            "colocated_share": sum(consumers[i][0] == producers[i][0] for i in consumers) / load.pairs,
            "consumer_delay_ms": 1e3 * float(np.mean([consumers[i][1] - producers[i][1] for i in consumers])),
            "finished": (len(replica_nodes) + len(consumers)) / (load.replicas + load.pairs),
            "left_on_ledger": float(left)}
