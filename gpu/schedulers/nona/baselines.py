"""The schemes Nona is compared with (§IV-A), as θ for ``GroupingSampler`` where they need no live state.

* ``undistributed_thetas`` — every subgraph stays on its source's server: no transfer ever.
* ``opportunistic_thetas`` — "Whenever the contracted graph presents parallel branches, distribute all these
  branches on different servers ... one of the branches is placed on the same server as the root of the
  subgraph": π = the subgraph's branches, k and l uniform (the sink joins a random branch).
* ``expert_thetas`` — a mix q·Opportunistic + (1−q)·undistributed; the benchmark picks q by grid search in the
  simulator for every data point, standing in for the paper's "manually derived" Expert; where no simulator
  runs (the serving rollout), ``expert_q`` picks it on the queueing model of §III-B instead.
* ``RandomPlacement`` — "Tasks allocations are chosen randomly": every task on a uniform server.

Spark's fair scheduler reads live state (which servers are idle), so it is part of the simulated world
(``gpu.sim.nona.engine``), not a sampler.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.nona.dag import Dag, branches, groupings, subgraphs, undistributed
from gpu.schedulers.nona.optimizer import NonaModel, theta_vector
from gpu.schedulers.nona.controller import QueryPlacement, Query


def undistributed_thetas(dags: Mapping[str, Dag], servers: int) -> dict[tuple[str, str], tuple[float, ...]]:
    """θ with all mass on the grouping that keeps each subgraph on one server."""
    out = {}
    for klass, dag in dags.items():
        for sub in subgraphs(dag):
            omega = groupings(sub, max_parts=servers)
            theta = np.zeros(len(omega))
            theta[undistributed(omega)] = 1.0
            out[(klass, sub.root)] = tuple(theta)
    return out


def opportunistic_thetas(dags: Mapping[str, Dag], servers: int) -> dict[tuple[str, str], tuple[float, ...]]:
    """θ uniform over (π = branches, any k, any l): every parallel branch on its own server."""
    out = {}
    for klass, dag in dags.items():
        for sub in subgraphs(dag):
            omega = groupings(sub, max_parts=servers)
            split = tuple(sorted(branches(dag, sub), key=lambda part: sub.intermediates.index(part[0])))
            hits = np.array([g.parts == split for g in omega], float)
            if not hits.any():  # more branches than servers: stay together
                hits[undistributed(omega)] = 1.0
            out[(klass, sub.root)] = tuple(hits / hits.sum())
    return out


def expert_thetas(dags: Mapping[str, Dag], servers: int, q: float) -> dict[tuple[str, str], tuple[float, ...]]:
    """q·Opportunistic + (1−q)·undistributed: distribute the branches of a fraction q of the queries."""
    if not 0 <= q <= 1:
        raise ConfigError("expert.q", q, "must be between 0 and 1")
    opp, und = opportunistic_thetas(dags, servers), undistributed_thetas(dags, servers)
    return {key: tuple(q * np.asarray(opp[key]) + (1 - q) * np.asarray(und[key])) for key in opp}


EXPERT_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


def expert_q(model: NonaModel, servers: int, grid: tuple[float, ...] = EXPERT_GRID) -> float:
    """Expert's q for ``model``'s classes, rates and link: the grid's q whose θ the M/G/1 model (§III-B) predicts
    the lowest objective Σ λ·JCT for (ties: the smallest q, distributing least).

    Example: a link so slow that every transfer queues → ``0.0`` (undistributed); a fast link and long
    parallel branches → ``1.0`` (Opportunistic)."""
    dags = {c.dag.name: c.dag for c in model.classes}

    def objective(q: float) -> float:
        thetas = expert_thetas(dags, servers, q)
        return model.predict(theta_vector(model, thetas)).objective

    return min(grid, key=lambda q: (objective(q), q))


class RandomPlacement:
    """Every task of a query on a uniformly random live server: compute- and congestion-oblivious.

    Places arrivals like ``NonaController.on_arrival``, so the serving rollout routes by it the same way."""

    name = "random"

    def __init__(self, dags: Mapping[str, Dag], seed: int = 0):
        self._dags, self.seed = dict(dags), int(seed)

    @property
    def dags(self) -> dict[str, Dag]:
        return dict(self._dags)

    def on_arrival(self, now: float, query: Query) -> QueryPlacement:
        return self.decide(query)

    def decide(self, query: Query) -> QueryPlacement:
        rng = np.random.default_rng((self.seed, query.id))
        dag = self._dags[query.klass]
        chosen = rng.choice(np.asarray(query.servers), size=len(dag.tasks))
        return QueryPlacement(query.id, query.klass, tuple((t, int(s)) for t, s in zip(dag.tasks, chosen)))
