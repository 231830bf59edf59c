"""How the serving rollout places a spec's multi-stage queries: Nona's θ or one of its baselines, per query.

Every placement but ``nexus`` hosts every stage on each of the spec's ``placement.nodes`` nodes
(``tasks.serving.nona.replicated_plan``); ``shares`` then routes each request by its session's plan shares, the
others each query by the placement they give it (Nona, Pit-Claudel et al., §III; the §IV-A baselines):
``nona`` samples it from θ solved against the spec's link for the profiled stage latencies and the spec's query
rates, ``expert`` from its mix q·Opportunistic + (1−q)·undistributed, the others by their fixed rule.
The μ those two weigh hand-offs against is the link's measured one (``link_mu``): on the socket link, a probe of
transfers of the spec's hand-off size before the rollout (``tasks.serving.transport.probe_mu``).
"""

from __future__ import annotations

from typing import Mapping

from gpu.errors import ConfigError
from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.schedulers.nona.controller import NonaRouting
from tasks.serving.nona import baseline_routing, solve_routing, stage_dag
from tasks.serving.spec import ServingSpec
from tasks.serving.transport import probe_mu

NEEDS_LINK = ("nona", "expert")
"""Placements that weigh the hand-offs against the link's capacity, so the spec must give ``link.mu``."""


def handoff_bytes(sp: ServingSpec) -> dict[str, float] | None:
    """Bytes per hand-off to each non-root query stage (the spec's ``link.bytes``; None: the input rows')."""
    if sp.handoff_bytes is None:
        return None
    return {child: sp.handoff_bytes for child in sp.chains()}


def link_mu(sp: ServingSpec, link: str = "socket") -> float | None:
    """μ (bytes/s) Nona and Expert solve with: on the ``socket`` link, measured by a probe of 20 transfers of one
    hand-off each (the spec's ``link.bytes``, else a 256-byte input row) over a fresh link paced at the spec's
    ``link.mu``; on the ``emulated`` link, the spec's ``link.mu`` (it is exact there)."""
    if sp.link_mu is None or link == "emulated":
        return sp.link_mu
    return probe_mu(sp.link_mu, sp.handoff_bytes or 256)


def query_routing(sp: ServingSpec, profiles: Mapping[str, BatchProfile],
                  mu: float | None = None) -> NonaRouting | None:
    """The frontend's per-query routing for ``sp.placement`` (None for ``nexus`` and ``shares``): θ solved before
    the rollout for Nona (§III-A), a baseline's rule otherwise, over the spec's multi-stage queries. ``mu``: the
    link's bytes/s to solve with (default the spec's ``link.mu``; ``link_mu`` measures it)."""
    if sp.placement in ("nexus", "shares"):
        return None
    handoff = handoff_bytes(sp)
    dags = {q.query_id: stage_dag(q.query_id, {st.name: st.model for st in q.stages}, sp.stage_inputs(q), profiles,
                                  handoff) for q in sp.queries if len(q.stages) > 1}
    if not dags:
        raise ConfigError("placement", sp.placement, "places multi-stage queries: the spec has none")
    rates = {q.query_id: q.rate for q in sp.queries}
    nodes = list(range(sp.nodes))
    mu = sp.link_mu if mu is None else mu
    if sp.placement == "nona":
        return solve_routing(dags, rates, nodes, mu, sp.seed)
    return baseline_routing(sp.placement, dags, nodes, sp.seed, rates, mu)
