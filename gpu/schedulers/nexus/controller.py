"""The Nexus controller: epoch scheduling, routing and query chaining, driven by a simulator or a serving flow.

Nexus (Shen et al., SOSP'19) runs one control loop: every epoch (§6.3, the authors' ``EpochSchedule``) the
global scheduler turns the frontends' measured request rates into a plan (squishy bin packing, §6.1), pushes
its routing table to the frontends (§5, deficit round robin over each session's GPUs), and at run time each
finished query stage issues the next stage's requests with the slack it did not use (§6.2). The controller
owns all three decisions; a world owns the clock and the work:

* the simulator (``gpu.sim.nexus.engine``, virtual ms; ``gpu.sim.nexus.epochs`` beacon by beacon) and
* the serving runtime and flow (``tasks.serving``, ``flows/serving_rollout.py``; real requests, ``perf_counter_ns``)

call the same hooks and differ only in the world (``gpu.contract``).

Hooks: ``on_epoch(now, rates)`` (a beacon's measured requests/s → :class:`EpochDecision`). The data-plane
calls ``route`` and ``chain`` answer per request burst and per finished batch, without a hook's bookkeeping.

Example::

    ctl = NexusController(EpochPlanner(SquishyPacker(profiles), sessions))
    ctl.on_epoch(31.0, {"a": 410.0})  # → EpochDecision(plan=Plan(...), epoch=True, replanned=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, TypeVar

import numpy as np

from gpu.schedulers.nexus.squishy import Plan
from gpu.schedulers.nexus.chaining import Issue, QueryChains
from gpu.schedulers.nexus.epoch import EpochPlanner
from gpu.schedulers.nexus.routing import DeficitRoundRobin, Router, WeightedRandom
from gpu.schedulers.nexus.policies import Strategy, policy_names, strategy

T = TypeVar("T")

__all__ = ["EpochDecision", "NexusController", "policy_names"]


@dataclass(frozen=True)
class EpochDecision:
    """What one beacon decided: the plan in force, whether an epoch ran and whether it changed the plan (a new
    plan is rolled out: its nodes started or updated, its routing table installed with ``install``)."""

    plan: Plan | None
    epoch: bool = False
    replanned: bool = False


class NexusController:
    """One Nexus deployment's decisions (module docstring).

    Args:
        planner: the epoch planner (its current plan is the first decision); None for a fixed plan that the
            world installs and no epoch changes (the §7.2 experiments, one ``simulate_plan``).
        chains: ``{child stage session: (parent stage session, γ)}``, queries served as DAGs (a join lists its
            parents as a tuple, ``nexus_chaining``).
        policy: the serving configuration (``gpu.schedulers.nexus.policies``); it names the load balancer unless
            ``load_balancer`` is given.
        rng: seed or generator of the routing (weighted random) and fan-out draws.
        time_unit: the world's clock for chaining deadlines, ``ms`` or ``ns``.
    """

    system = "nexus"
    hooks = ("on_epoch",)

    def __init__(self, planner: EpochPlanner | None = None, *, chains: Mapping[str, tuple[str, float]] | None = None,
                 policy: str = "nexus", load_balancer: str | None = None, rng: np.random.Generator | int = 0,
                 time_unit: str = "ms"):
        self.strategy: Strategy = strategy(policy)
        self.policy = policy
        rng = np.random.default_rng(rng)
        self.router = Router(load_balancer or self.strategy.load_balancer, rng)
        self.chains = QueryChains(chains or {}, rng, time_unit)
        self.planner = planner
        self.plan: Plan | None = planner.plan if planner else None

    def on_epoch(self, now: float, rates: Mapping[str, float]) -> EpochDecision:
        """A beacon at ``now`` (s) with each session's measured requests/s: run the epoch rules (Nexus §6.3:
        every ``epoch_s``, or early when a rate leaves its band) and return the plan in force."""
        if self.planner is None:
            return EpochDecision(self.plan)
        before = len(self.planner.epochs)
        new = self.planner.observe(now, rates)
        if new is not None:
            self.plan = new
        return EpochDecision(self.plan, len(self.planner.epochs) > before, new is not None)

    def install(self, plan: Plan, ready_ms: Mapping[str, float] | None = None) -> None:
        """Route and chain by ``plan`` as rolled out (its unassigned load routed, ``route_unassigned``);
        ``ready_ms``: per session, CPU pre-processing overlapped before a request joins a batch (OL)."""
        self.router.set_plan(plan)
        self.chains.set_plan(plan, ready_ms)

    def route(self, session_id: str, targets: Mapping[int, T]) -> DeficitRoundRobin | WeightedRandom | None:
        """The balancer spreading ``session_id``'s requests over its GPUs (``targets``: node id → what the world
        pushes to); None when no GPU hosts it (the world drops its requests)."""
        return self.router.picker(session_id, targets)

    def chain(self, now: float | int, session_id: str, deadlines: np.ndarray | float | int,
              queries: np.ndarray | None = None) -> tuple[Issue, ...]:
        """The next stages' requests of a batch of ``session_id`` finished at ``now`` (``QueryChains.issue``;
        ``queries``: each request's query, for joins)."""
        return self.chains.issue(now, session_id, deadlines, queries)
