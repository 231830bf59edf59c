"""Nona as a placement option of the serving rollout: a query's stages as Nona's DAG, θ solved, a plan that
hosts every stage on every node, and the per-query routing that follows each query's sampled placement.

Nona (Pit-Claudel et al., "Nona: A Stochastic Congestion-Aware Job Scheduler for Real-Time Inference Queries")
places each query's tasks on servers by sampling a grouping from θ, solved offline against an M/G/1 model of
the bottleneck link (§III). Mapped onto the serving stack:

* a task is a query stage (a serving session ``query/stage``); its ops ``p`` are the stage's measured batch-1
  latency ℓ(1) in seconds on servers of ν = 1 (workers keep batching: a batch of b costs ℓ(b) ≤ b·ℓ(1), so
  the model's compute time is an upper bound at load);
* an edge's bytes ``b`` are what the child stage receives per request (``handoff_bytes``: the parent's
  activation size; default the request's input row);
* a server is a plan node, and every node Nona may use hosts every stage (``replicated_plan``), so any
  grouping can be served;
* θ is solved once before the rollout (``solve_routing``) for the query rates of the spec; the link is the
  runtime's emulated one (``tasks.serving.link``) of capacity μ.

Example: ``solve_routing({"q": query}, {"digits_mlp": profile}, nodes=2, mu=2e5)`` → a ``NonaRouting`` that
sends whole queries to one node when the link is slow.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session
from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.schedulers.nona.optimizer import Cluster, LookupTable, NonaModel, QueryClass, solve
from gpu.schedulers.nona.dag import Dag
from gpu.schedulers.nona.policy import NonaController, NonaRouting

INPUT_BYTES = 64 * 4  # a digits request: 64 float32 features


def stage_dag(query_id: str, models: Mapping[str, str], inputs: Mapping[str, Sequence[str]],
              profiles: Mapping[str, BatchProfile], handoff_bytes: Mapping[str, float] | None = None) -> Dag:
    """One query's stages as Nona's DAG: ops = ℓ(1) in s, edge bytes = the child's hand-off bytes per request.

    ``models``: stage → its model; ``inputs``: stage → its parent stages (a join has several)."""
    sizes = handoff_bytes or {}
    ops = {u: profiles[m].latency(1) / 1e3 for u, m in models.items()}
    edges = {(p, u): float(sizes.get(f"{query_id}/{u}", INPUT_BYTES)) for u, ps in inputs.items() for p in ps}
    return Dag.build(query_id, ops, edges)


def solve_routing(dags: Mapping[str, Dag], rates: Mapping[str, float], nodes: Sequence[int], mu: float,
                  seed: int = 0) -> NonaRouting:
    """θ for the classes at ``rates`` (queries/s) on ``len(nodes)`` servers and a link of ``mu`` bytes/s
    (§III-C, multi-start), as the per-query routing of the runtime.

    Raises ``ConfigError`` (from ``solve``) naming the classes, rates and μ when no θ keeps the link stable."""
    if not nodes:
        raise ConfigError("nodes", list(nodes), "Nona needs at least one node")
    model = NonaModel([QueryClass(d, float(rates.get(k, 0.0))) for k, d in dags.items()],
                      Cluster(servers=len(nodes), nu=1.0, mu=float(mu)))
    table = LookupTable((solve(model, seed=seed),))
    ctl = NonaController(dict(dags), table, len(nodes), seed=seed)
    stages = {f"{k}/{t}": (k, t) for k, d in dags.items() for t in d.tasks}
    return NonaRouting(ctl, stages)


def replicated_plan(sessions: Sequence[Session], profiles: Mapping[str, BatchProfile], nodes: int,
                    batch: int = 1) -> Plan:
    """``nodes`` GPU nodes each hosting every session at ``1/nodes`` of its rate (batches of ``batch``): the
    plan under Nona's placement, where any node may run any stage of a query (Nona §III-A)."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError("nodes", nodes, "must be a whole number >= 1")
    out = []
    for n in range(nodes):
        placements = []
        for s in sessions:
            lat = profiles[s.model].latency(batch)
            placements.append(SessionPlacement(s.session_id, s.model, s.slo_ms, batch, s.rate / nodes, lat, 2 * lat))
        out.append(GpuNode(n, sum(p.latency_ms for p in placements), tuple(placements)))
    return Plan("nona", "paper", tuple(out), tuple(sessions))
