"""Affinity and anti-affinity on real tasks (Bhardwaj, ESCHER, thesis Table 4.2 P3 and P1; §4.5 Fig. 4.6a).

``run_affinity``: two serving replicas request ``anti-replicas`` (capacity 1 per node), so they run on distinct
nodes; a producer creates ``coloc-producer`` on its own node from inside its task, and a consumer submitted beside
it waits for that resource and lands on the producer's node. ``run_colocation``: AlphaZero's predictors are
load-balanced one per node and each board aggregator follows its predictor through ``coloc-predictor-<i>``.
Each returns the tasks' rows (where they ran) and deletes the resources it made once its tasks are done.
"""

from __future__ import annotations

from gpu.schedulers.escher.api import Escher, NodeSpec
from gpu.schedulers.escher.primitives import anti_affinity, with_task
from tasks.escher.jobs import board_aggregator, consumer, predictor, producer, replica
from tasks.runtime.requests import gpu_options

EVERY_NODE = NodeSpec()
MOVES = 16  # candidate moves an AlphaZero aggregator expands per round


def run_affinity(esl: Escher, steps: int) -> dict:
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
