"""The serving frontend: stamps each request, routes it to a worker holding its session, counts rates.

Nexus §5/§6 and spec §3.7: the global scheduler's routing table (``Plan.rate_shares()``: session → {node:
share}) is pushed to the frontends every epoch; each request goes to one of the session's backends in
proportion to the throughput allocated there. Two load balancers from the authors' code
(``app/model_handler.cpp``, flag ``load_balance``): ``drr`` — deficit round robin with quantum
``share / min share`` (the default since 2020; exact proportions, no randomness) — and ``weighted_random``
(the paper-time default). The frontend also counts arrivals per session, which the epoch planner reads
every beacon as the measured request rate.

Example (spec T13): shares {1: 2/3, 2: 1/3} → DRR over 300 requests sends 200 to node 1 and 100 to node 2.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any, Mapping, Sequence

import numpy as np

from gpu.batching import Request
from gpu.errors import ConfigError
from gpu.schedulers.nexus import Plan
from tasks.serving.stats import Outcome, Recorder


class DeficitRoundRobin:
    """Picks targets in proportion to their weights: each visit adds ``weight / min weight`` credit."""

    def __init__(self, targets: Sequence[Any], weights: Sequence[float]):
        if len(targets) != len(weights) or not targets or min(weights) <= 0:
            raise ConfigError("weights", list(weights), "need one positive weight per target")
        low = min(weights)
        self.targets = list(targets)
        self.quantum = [w / low for w in weights]
        self.deficit = [0.0] * len(targets)
        self.cur = len(targets) - 1

    def pick(self) -> Any:
        if len(self.targets) == 1:
            return self.targets[0]
        while True:
            if self.deficit[self.cur] >= 1.0 - 1e-9:
                self.deficit[self.cur] -= 1.0
                return self.targets[self.cur]
            self.cur = (self.cur + 1) % len(self.targets)
            self.deficit[self.cur] += self.quantum[self.cur]


class WeightedRandom:
    """Picks a target at random with probability ∝ its weight (seeded)."""

    def __init__(self, targets: Sequence[Any], weights: Sequence[float], rng: np.random.Generator):
        if len(targets) != len(weights) or not targets or min(weights) <= 0:
            raise ConfigError("weights", list(weights), "need one positive weight per target")
        self.targets = list(targets)
        self.cdf = np.cumsum(np.asarray(weights, float) / float(sum(weights)))
        self.rng = rng

    def pick(self) -> Any:
        if len(self.targets) == 1:
            return self.targets[0]
        return self.targets[min(int(np.searchsorted(self.cdf, self.rng.random(), side="right")),
                                len(self.targets) - 1)]


LOAD_BALANCERS = ("drr", "weighted_random")


class Frontend:
    """Routes requests by the current plan's rate shares; one thread submits (the load generator's)."""

    def __init__(self, recorder: Recorder, load_balancer: str = "drr", seed: int = 0):
        if load_balancer not in LOAD_BALANCERS:
            raise ConfigError("load_balancer", load_balancer, f"unknown; choose one of {list(LOAD_BALANCERS)}")
        self.recorder = recorder
        self.load_balancer = load_balancer
        self._rng = np.random.default_rng(seed)
        self._routes: dict[str, Any] = {}
        self._slo: dict[str, float] = {}
        self._ids = itertools.count()
        self.counts: dict[str, int] = {}
        self.route_ns = 0
        self.submitted = 0

    def set_plan(self, plan: Plan, workers: Mapping[int, Any]) -> None:
        """Install the routing table of ``plan``; ``workers`` maps node id → the worker running it."""
        routes: dict[str, Any] = {}
        for sid, shares in plan.rate_shares().items():
            nodes = sorted(n for n, w in shares.items() if w > 0)
            targets = [workers[n] for n in nodes]
            weights = [shares[n] for n in nodes]
            routes[sid] = (DeficitRoundRobin(targets, weights) if self.load_balancer == "drr"
                           else WeightedRandom(targets, weights, self._rng))
        self._slo = {s.session_id: float(s.slo_ms) for s in plan.sessions}
        for sid in self._slo:
            self.counts.setdefault(sid, 0)
        self._routes = routes

    def submit(self, session_id: str, x: Any) -> int:
        """Accept one request now; returns its id. A planned session with no GPU (rate 0) is dropped."""
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        slo = self._slo.get(session_id)
        if slo is None:
            raise ConfigError("session_id", session_id, f"not a session of the current plan ({sorted(self._slo)})")
        rid = next(self._ids)
        now = t0 / 1e6
        req = Request(rid, session_id, now, now + slo)
        self.counts[session_id] += 1
        route = self._routes.get(session_id)
        if route is None:
            self.recorder.add(Outcome(rid, session_id, -1, now, now + slo, math.nan, 0, -1))
        else:
            route.pick().enqueue(req, x)
        self.submitted += 1
        self.route_ns += time.thread_time_ns() - c0  # CPU time: pre-emption by other processes is not ours
        return rid

    def take_counts(self) -> dict[str, int]:
        """Arrivals per session since the last call (what a frontend reports every beacon)."""
        out = dict(self.counts)
        for sid in out:
            self.counts[sid] = 0
        return out
