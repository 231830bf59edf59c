"""Query DAGs served as DAGs: which requests a finished stage request issues to the next stages, due when.

Nexus §6.2 splits a query's latency SLO across its stages; at run time a stage's request is issued by its
parent's finished request and inherits its unused slack (the authors' ``request_context``): the child arrives
when the parent's batch finishes and must finish by the parent's deadline plus its own stage budget, so a
root-to-leaf path ends by the query's arrival + its end-to-end SLO. Each parent that finished on time issues
Poisson(γ) children (γ: the stage's average fan-out, §6.2, e.g. faces per frame); a dropped or late parent
issues none — its query is bad already.

This is the one implementation: the simulator (``gpu.sim.nexus_engine``, virtual ms) and the serving runtime
(``tasks.serving.chaining``, ``perf_counter_ns``) both ask :meth:`QueryChains.issue`, through the Nexus
controller, and only turn its answer into their own requests.

Example: chains ``{"q/r": ("q/d", 2.0)}``, ``q/r``'s budget 20 ms; a ``q/d`` batch finishing at 35 ms with
deadlines ``[50, 30]`` → ``(Issue("q/r", parents=[0, 0], deadlines=[70, 70]),)`` when the draw gives 2 and 1
(the second parent was late: no children).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.nexus_profiles import TOL_MS

TICKS_PER_MS = {"ms": 1.0, "ns": 1_000_000}
"""The clocks a world may chain on: the simulator's float ms, the runtime's integer ``perf_counter_ns``."""

FANOUT_BLOCK = 4096  # fan-outs drawn per numpy call: one draw per request costs µs on the serving path


@dataclass(frozen=True)
class Issue:
    """Requests one finished parent batch issues to one child stage.

    ``parents``: for each issued request, the position of its parent in the finished batch (a parent with
    fan-out ``k`` appears ``k`` times); ``deadlines``: each issued request's deadline, its parent's plus the
    child's stage budget, on the world's clock.
    """

    session_id: str
    parents: np.ndarray
    deadlines: np.ndarray


class QueryChains:
    """The stage tree of every query and the stage budgets of the plan in force.

    Args:
        chains: ``{child stage session: (parent stage session, γ)}``.
        rng: the fan-out draws (a seed or a generator).
        time_unit: the world's clock, ``ms`` (floats) or ``ns`` (integers), see :data:`TICKS_PER_MS`.
    """

    def __init__(self, chains: Mapping[str, tuple[str, float]], rng: np.random.Generator | int = 0,
                 time_unit: str = "ms"):
        if time_unit not in TICKS_PER_MS:
            raise ConfigError("time_unit", time_unit, f"choose one of {list(TICKS_PER_MS)}")
        self.chains = dict(chains)
        self.children: dict[str, list[tuple[str, float]]] = {}
        for child, (parent, gamma) in self.chains.items():
            if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0):
                raise ConfigError(f"{child}.gamma", gamma, "must be a finite fan-out >= 0")
            if child == parent or self._has_ancestor(parent, child):
                raise ConfigError("chains", child, f"a stage cannot be its own ancestor (parent {parent!r})")
            self.children.setdefault(parent, []).append((child, float(gamma)))
        self.parents = frozenset(self.children)
        self.roots = {sid: self._top(sid) for sid in [*self.children, *self.chains]}  # stage -> its query's root
        self.time_unit = time_unit
        self._per_ms = TICKS_PER_MS[time_unit]
        self._tol = TOL_MS * self._per_ms  # on time: finish <= deadline + TOL_MS, as ``nexus_profiles.fits``
        self._budget: dict[str, float | int] = {}
        self._rng = np.random.default_rng(rng)
        self._fanouts: dict[str, tuple[np.ndarray, int]] = {}  # child -> (pre-drawn fan-outs, next unused)
        self._lock = threading.Lock()  # the runtime issues from every worker thread

    def _has_ancestor(self, sid: str, ancestor: str) -> bool:
        seen = set()
        while sid in self.chains and sid not in seen:
            seen.add(sid)
            sid = self.chains[sid][0]
            if sid == ancestor:
                return True
        return False

    def _top(self, sid: str) -> str:
        while sid in self.chains:
            sid = self.chains[sid][0]
        return sid

    def depth(self, sid: str) -> int:
        """Number of stages above ``sid``."""
        return 0 if sid not in self.chains else 1 + self.depth(self.chains[sid][0])

    def set_plan(self, plan, ready_ms: Mapping[str, float] | None = None) -> None:
        """Take the stage budgets of ``plan`` (a ``gpu.schedulers.nexus.Plan``): a session's SLO plus the CPU
        pre-processing overlapped before it joins a batch (``ready_ms``; the plan's SLO is the GPU's share)."""
        ready = ready_ms or {}
        budget = {s.session_id: (s.slo_ms + ready.get(s.session_id, 0.0)) * self._per_ms for s in plan.sessions
                  if s.session_id in self.chains}
        self._budget = {sid: round(b) for sid, b in budget.items()} if self.time_unit == "ns" else budget

    def budget(self, session_id: str) -> float | int:
        """A child stage's budget on the world's clock (0 for a stage the plan does not list)."""
        return self._budget.get(session_id, 0)

    def _fanout(self, child: str, gamma: float, k: int) -> np.ndarray:
        """The next ``k`` Poisson(γ) fan-outs of ``child``."""
        with self._lock:
            block, at = self._fanouts.get(child, (np.empty(0, np.int64), 0))
            if at + k > len(block):
                block, at = np.concatenate([block[at:], self._rng.poisson(gamma, max(FANOUT_BLOCK, k))]), 0
            self._fanouts[child] = block, at + k
        return block[at:at + k]

    def issue(self, now: float | int, session_id: str, deadlines: np.ndarray | float | int) -> tuple[Issue, ...]:
        """The children of a batch of stage ``session_id`` that finished at ``now`` (its requests' ``deadlines``).

        Only parents that finished on time issue; a stage with no children issues nothing.
        """
        kids = self.children.get(session_id)
        if not kids:
            return ()
        if type(deadlines) in (int, float):  # a batch of one, the runtime's common case at low load: no mask
            if now > deadlines + self._tol:
                return ()
            fanouts = [(child, int(self._fanout(child, gamma, 1)[0])) for child, gamma in kids]
            return tuple(Issue(child, np.zeros(n, np.intp), np.full(n, deadlines + self.budget(child)))
                         for child, n in fanouts if n)
        due = np.atleast_1d(deadlines)
        on_time = now <= due + self._tol
        if not on_time.any():
            return ()
        out = []
        for child, gamma in kids:
            idx = np.repeat(np.arange(len(due)), self._fanout(child, gamma, len(due)) * on_time)
            if len(idx):
                out.append(Issue(child, idx, due[idx] + self.budget(child)))
        return tuple(out)
