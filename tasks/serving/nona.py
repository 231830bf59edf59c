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
* θ is solved before the rollout (``solve_routing``) for the query rates of the spec and the profiled ℓ(1),
  then again every epoch from what the rollout measured (:class:`MeasuredNona`): each class's arrival rate
  (its root stage's arrivals over the epoch) and each stage's service time (the mean forward time per request
  of the batches its workers ran), both handed to ``NonaController.on_epoch``; the link is the runtime's, real
  bytes on a loopback socket paced at the spec's μ (``tasks.serving.transport``), and μ for the solver is what
  it measured: probed before the rollout (``probe_mu``), then the epoch's bytes over their transfer time;
* the §IV-A baselines that need no live state route the same way (``baseline_routing``): ``undistributed``,
  ``opportunistic``, ``random`` and ``expert`` (q·Opportunistic + (1−q)·undistributed, q the grid's best on
  the queueing model of the profiled stages, the spec's rates and its link: ``expert_q``).

Example: ``solve_routing({"q": query}, {"digits_mlp": profile}, nodes=2, mu=2e5)`` → a ``NonaRouting`` that
sends whole queries to one node when the link is slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session
from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.schedulers.nona.baselines import (RandomPlacement, expert_q, expert_thetas, opportunistic_thetas,
                                           undistributed_thetas)
from gpu.schedulers.nona.optimizer import (Cluster, LookupTable, NonaModel, QueryClass, Solution, solve,
                                           theta_vector)
from gpu.schedulers.nona.dag import Dag
from gpu.schedulers.nona.controller import NonaController, NonaRouting
from tasks.serving.transport import measured_mu

INPUT_BYTES = 64 * 4  # a digits request: 64 float32 features
BASELINES = ("undistributed", "opportunistic", "random", "expert")
"""Nona's §IV-A baselines the rollout serves with (``--placement``). Spark's fair scheduler is not one: it
places each ready task on whichever server is idle at that moment, live state only the simulator's world holds
(``gpu.sim.nona.engine``)."""


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
    table = LookupTable((solve(serving_model(dags, rates, len(nodes), mu), seed=seed),))
    return NonaRouting(NonaController(dict(dags), table, len(nodes), seed=seed), _stages(dags))


def serving_model(dags: Mapping[str, Dag], rates: Mapping[str, float], servers: int, mu: float) -> NonaModel:
    """Nona's queueing model of the served classes: servers of ν = 1 (ops are seconds) behind a link of ``mu``."""
    return NonaModel([QueryClass(d, float(rates.get(k, 0.0))) for k, d in dags.items()],
                     Cluster(servers=servers, nu=1.0, mu=float(mu)))


def _stages(dags: Mapping[str, Dag]) -> dict[str, tuple[str, str]]:
    return {f"{k}/{t}": (k, t) for k, d in dags.items() for t in d.tasks}


def baseline_routing(name: str, dags: Mapping[str, Dag], nodes: Sequence[int], seed: int = 0,
                     rates: Mapping[str, float] | None = None, mu: float | None = None) -> NonaRouting:
    """The routing of one of Nona's baselines (``BASELINES``), with no θ to solve. Only ``expert`` reads the
    classes' ``rates`` and the link's ``mu`` (bytes/s), to pick its q (``expert_q``)."""
    if name == "random":
        return NonaRouting(RandomPlacement(dags, seed), _stages(dags))
    n = len(nodes)
    if name == "expert":
        if mu is None:
            raise ConfigError("link.mu", mu, "placement expert picks its q against the link: give its capacity")
        model = serving_model(dags, rates or {}, n, mu)
        thetas = expert_thetas(dags, n, expert_q(model, n))
    else:
        model = serving_model(dags, {}, n, 1.0)
        thetas = (undistributed_thetas if name == "undistributed" else opportunistic_thetas)(dags, n)
    fixed = Solution(dict(rates or {k: 0.0 for k in dags}), thetas, model.predict(theta_vector(model, thetas)))
    return NonaRouting(NonaController(dict(dags), LookupTable((fixed,)), len(nodes), seed=seed, policy=name),
                       _stages(dags))


@dataclass(frozen=True)
class ThetaEpoch:
    """What one epoch gave Nona: measured rates (queries/s) and stage service times (ms per request), the
    table entry in force after it, whether θ was re-solved, θ per ``"class:subgraph root"``, and the link's μ
    (bytes/s) θ is solved with after it (the measured one once it moved beyond ±40 %)."""

    t_s: float
    rates: dict[str, float]
    service_ms: dict[str, float]
    entry: int
    resolved: bool
    thetas: dict[str, list[float]]
    link_mu: float = float("nan")


class MeasuredNona:
    """Drives the rollout's ``NonaController`` every epoch from measurements (Nona §III-A, §IV-D).

    ``on_epoch`` turns the root stages' arrivals into each class's λ and the workers' batches into each stage's
    service time, calls the controller's ``on_epoch`` with both, and re-solves θ (off the serving path, in
    the epoch's thread) when the controller asks; a rate no θ keeps stable leaves the θ in force. With a
    ``link`` that measures itself (``SocketLink.take_measured``), the epoch's bytes over their transfer time is
    the link's μ; one beyond ±40 % of the μ θ was solved with makes the table stale and θ is re-solved for it.

    Args:
        routing: the frontend's ``NonaRouting`` around a ``NonaController``.
        nodes: the servers θ is solved for; ``mu``: the link's bytes/s θ was solved with.
        link: the runtime's link, when it measures itself (set once the runtime is up).
    """

    def __init__(self, routing: NonaRouting, nodes: int, mu: float, seed: int = 0, link: Any = None):
        self.routing, self.nodes, self.mu, self.seed, self.link = routing, nodes, float(mu), seed, link
        self.controller: NonaController = routing.controller
        self.history: list[ThetaEpoch] = []

    def on_epoch(self, t_s: float, arrivals: Mapping[str, int], span_s: float,
                 batches: Mapping[str, Sequence[tuple[int, float]]]) -> ThetaEpoch:
        """``arrivals``: per session, requests that arrived over the last ``span_s`` s; ``batches``: per
        session, ``(k, forward ms)`` of each batch its workers ran meanwhile."""
        ctl = self.controller
        dags = ctl.dags
        rates = {k: arrivals.get(f"{k}/{d.source}", 0) / span_s for k, d in dags.items()}
        per_request = {sid: float(np.mean([ms / k for k, ms in runs])) for sid, runs in batches.items() if runs}
        service = {k: {t: per_request[f"{k}/{t}"] / 1e3 for t in d.tasks if f"{k}/{t}" in per_request}
                   for k, d in dags.items()}
        if self.link is not None and hasattr(self.link, "take_measured"):
            mu = measured_mu(*self.link.take_measured())
            if mu is not None and abs(np.log(mu / self.mu)) > ctl.tolerance:
                self.mu = mu
                ctl.invalidate()
        choice = ctl.on_epoch(t_s, rates, {k: v for k, v in service.items() if v})
        resolved = False
        if choice.resolve and all(r > 0 for r in rates.values()):
            try:
                ctl.add_solution(solve(serving_model(ctl.dags, rates, self.nodes, self.mu), seed=self.seed))
                ctl.on_epoch(t_s, rates)
                resolved = True
            except ConfigError:
                pass  # no θ keeps the link stable at these rates: the one in force stays
        row = ThetaEpoch(t_s, rates, per_request, ctl.entry, resolved, self.thetas, self.mu)
        self.history.append(row)
        return row

    @property
    def thetas(self) -> dict[str, list[float]]:
        """θ in force per ``"class:subgraph root"`` (aligned with its Ω), as the result and MLflow keep it."""
        ctl = self.controller
        return {f"{k}:{root}": list(th) for (k, root), th in ctl.table.entries[ctl.entry].thetas.items()}


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
