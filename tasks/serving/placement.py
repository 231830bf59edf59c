"""How the serving rollout places a spec's multi-stage queries: Nona's θ or one of its baselines, per query.

Every placement but ``nexus`` hosts every stage on each of the spec's ``placement.nodes`` nodes
(``tasks.serving.nona.replicated_plan``); ``shares`` then routes each request by its session's plan shares, the
others each query by the placement they give it (Nona, Pit-Claudel et al., §III; the §IV-A baselines):
``nona`` samples it from θ solved against the spec's link for the profiled stage latencies and the spec's query
rates, ``expert`` from its mix q·Opportunistic + (1−q)·undistributed, the others by their fixed rule.
"""

from __future__ import annotations

from typing import Mapping

from gpu.errors import ConfigError
from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.schedulers.nona.controller import NonaRouting
from tasks.serving.nona import baseline_routing, solve_routing, stage_dag
from tasks.serving.spec import ServingSpec

NEEDS_LINK = ("nona", "expert")
"""Placements that weigh the hand-offs against the link's capacity, so the spec must give ``link.mu``."""


def handoff_bytes(sp: ServingSpec) -> dict[str, float] | None:
    """Bytes per hand-off to each non-root query stage (the spec's ``link.bytes``; None: the input rows')."""
    if sp.handoff_bytes is None:
        return None
    return {child: sp.handoff_bytes for child in sp.chains()}


def query_routing(sp: ServingSpec, profiles: Mapping[str, BatchProfile]) -> NonaRouting | None:
    """The frontend's per-query routing for ``sp.placement`` (None for ``nexus`` and ``shares``): θ solved before
    the rollout for Nona (§III-A), a baseline's rule otherwise, over the spec's multi-stage queries."""
    if sp.placement in ("nexus", "shares"):
        return None
    handoff = handoff_bytes(sp)
    dags = {q.query_id: stage_dag(q.query_id, {st.name: st.model for st in q.stages}, sp.stage_inputs(q), profiles,
                                  handoff) for q in sp.queries if len(q.stages) > 1}
    if not dags:
        raise ConfigError("placement", sp.placement, "places multi-stage queries: the spec has none")
    rates = {q.query_id: q.rate for q in sp.queries}
    nodes = list(range(sp.nodes))
    if sp.placement == "nona":
        return solve_routing(dags, rates, nodes, sp.link_mu, sp.seed)
    return baseline_routing(sp.placement, dags, nodes, sp.seed, rates, sp.link_mu)
