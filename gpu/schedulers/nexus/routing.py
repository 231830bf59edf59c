"""How a Nexus frontend spreads one session's requests over the GPUs that host it.

Nexus §5 ("Data plane"): the frontend's library "consults the local routing table to find a suitable backend
for that model"; the global scheduler's routing table (``Plan.rate_shares()``: session → {node: share}) gives
each backend the share of the session's throughput allocated there. Two load balancers of the authors' code
(``app/model_handler.cpp``, flag ``load_balance``):

* ``drr`` — deficit round robin, quantum ``share / min share``; a backend is picked while its deficit is ≥ 1.
  Exact proportions and no randomness; the code's default since 2020.
* ``weighted_random`` — each request independently, probability ∝ share (the default when the paper was
  written).

A :class:`Router` holds the routing table of the plan in force and hands out one balancer per session over
whatever stands for its GPUs (node ids, worker threads, a simulated GPU's queue). The Nexus controller
(``gpu.schedulers.nexus.controller``) owns one; the serving frontend (``tasks/serving/frontend.py``) and the
simulator (``gpu/sim/nexus/engine.py``) route through it, so for the same shares they send the same request
sequence to the same GPUs.

Per-query routing (:class:`QueryRouting`): a seam that may route each request of a multi-stage query by its
query (the id of the query's root request) instead of by its session's shares — Nona places a whole query
at once (``gpu.schedulers.nona.controller.NonaRouting``). The default, :class:`PlanShares`, routes nothing
itself: every request follows its session's shares, as Nexus does.

Example: ``DeficitRoundRobin("ab", [2, 1]).pick_many(6)`` → ``[0, 0, 1, 0, 0, 1]``.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from gpu.errors import ConfigError

T = TypeVar("T")

LOAD_BALANCERS = ("drr", "weighted_random")


def _check(targets: Sequence[Any], weights: Sequence[float]) -> None:
    if len(targets) != len(weights) or not len(targets) or min(weights) <= 0:
        raise ConfigError("weights", list(weights), "need one positive weight per target")


class DeficitRoundRobin:
    """Picks targets in proportion to their weights: each visit adds ``weight / min weight`` credit."""

    def __init__(self, targets: Sequence[Any], weights: Sequence[float]):
        _check(targets, weights)
        low = min(weights)
        self.targets = list(targets)
        self.quantum = [w / low for w in weights]
        self.deficit = [0.0] * len(targets)
        self.cur = len(targets) - 1

    def pick_index(self) -> int:
        if len(self.targets) == 1:
            return 0
        while True:
            if self.deficit[self.cur] >= 1.0 - 1e-9:
                self.deficit[self.cur] -= 1.0
                return self.cur
            self.cur = (self.cur + 1) % len(self.targets)
            self.deficit[self.cur] += self.quantum[self.cur]

    def pick_many(self, k: int) -> np.ndarray:
        """Target positions of the next ``k`` requests (the same sequence as ``k`` picks)."""
        return np.fromiter((self.pick_index() for _ in range(k)), np.int64, k)


class WeightedRandom:
    """Picks targets at random with probability ∝ their weights (seeded).

    The choices are drawn ``block`` at a time with one vectorised numpy call and handed out as slices, so
    routing a burst (or one request) costs a slice, not a generator call and a search per request.
    """

    def __init__(self, targets: Sequence[Any], weights: Sequence[float], rng: np.random.Generator,
                 block: int = 4096):
        _check(targets, weights)
        self.targets = list(targets)
        self.p = np.asarray(weights, float) / float(sum(weights))
        self.rng = rng
        self.block = block
        self._drawn = np.empty(0, np.int64)
        self._pos = 0

    def pick_many(self, k: int) -> np.ndarray:
        """Target positions of the next ``k`` requests."""
        if self._pos + k > len(self._drawn):
            rest = self._drawn[self._pos:]
            self._drawn = np.concatenate([rest, self.rng.choice(len(self.targets), size=max(self.block, k), p=self.p)])
            self._pos = 0
        out = self._drawn[self._pos:self._pos + k]
        self._pos += k
        return out


def route_table(shares: Mapping[int, float]) -> tuple[list[int], list[float]]:
    """One session's GPUs (node ids, ascending) and their routing shares, GPUs with no share left out."""
    nodes = sorted(n for n, w in shares.items() if w > 0)
    return nodes, [shares[n] for n in nodes]


def balancer(kind: str, targets: Sequence[Any], weights: Sequence[float],
             rng: np.random.Generator) -> DeficitRoundRobin | WeightedRandom:
    """The load balancer ``kind`` (one of :data:`LOAD_BALANCERS`) over ``targets`` with routing shares ``weights``."""
    if kind == "drr":
        return DeficitRoundRobin(targets, weights)
    if kind == "weighted_random":
        return WeightedRandom(targets, weights, rng)
    raise ConfigError("load_balancer", kind, f"unknown; choose one of {list(LOAD_BALANCERS)}")


class Router:
    """The routing table of the plan in force (Nexus §5: session → {GPU: share}) and its load balancer kind.

    ``set_plan`` installs a plan's ``rate_shares()``; ``picker(session, targets)`` is a balancer of ``kind`` over
    the session's GPUs in ascending node order, each GPU's node id mapped to its target by ``targets``.
    All pickers draw from one seeded ``rng`` (weighted random only; DRR draws nothing).
    """

    def __init__(self, kind: str = "drr", rng: np.random.Generator | int = 0):
        if kind not in LOAD_BALANCERS:
            raise ConfigError("load_balancer", kind, f"unknown; choose one of {list(LOAD_BALANCERS)}")
        self.kind = kind
        self.rng = np.random.default_rng(rng)
        self.shares: dict[str, dict[int, float]] = {}

    def set_plan(self, plan: Any) -> None:
        """Route by ``plan`` (a ``gpu.schedulers.nexus.squishy.Plan``; its unassigned load routed first if it is to be
        served, ``nexus_overflow.route_unassigned``)."""
        self.shares = plan.rate_shares()

    def nodes(self, session_id: str) -> tuple[list[int], list[float]]:
        """The session's GPUs (node ids, ascending) and their shares; empty when no GPU hosts it."""
        return route_table(self.shares.get(session_id, {}))

    def picker(self, session_id: str, targets: Mapping[int, T]) -> DeficitRoundRobin | WeightedRandom | None:
        """A balancer over the session's GPUs as ``targets[node id]``; None when no GPU hosts the session."""
        nodes, weights = self.nodes(session_id)
        return balancer(self.kind, [targets[n] for n in nodes], weights, self.rng) if nodes else None


class QueryRouting(Protocol):
    """Where each request of a query stage goes, keyed by its query (the id of the query's root request)."""

    def set_hosts(self, hosts: Mapping[str, Sequence[int]]) -> None:
        """The plan in force: session → the node ids that host it."""

    def where(self, now: float, session_id: str, queries: np.ndarray) -> np.ndarray | None:
        """Node id per request of ``session_id`` (``queries``: each request's query) at ``now`` (s), or None
        to route them by the session's shares."""


class PlanShares:
    """The default routing: no per-query choice, every request follows its session's plan shares (Nexus §5)."""

    def set_hosts(self, hosts: Mapping[str, Sequence[int]]) -> None:
        return None

    def where(self, now: float, session_id: str, queries: np.ndarray) -> np.ndarray | None:
        return None
