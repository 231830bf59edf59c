"""Query DAGs served as DAGs: which requests a finished stage request issues to the next stages, due when.

Nexus §6.2 splits a query's latency SLO across its stages; at run time a stage's request is issued by its
parent's finished request and inherits its unused slack (the authors' ``request_context``): the child arrives
when the parent's batch finishes and must finish by the parent's deadline plus its own stage budget, so a
root-to-leaf path ends by the query's arrival + its end-to-end SLO. Each parent that finished on time issues
Poisson(γ) children (γ: the stage's average fan-out, §6.2, e.g. faces per frame); a dropped or late parent
issues none — its query is bad already.

Joins (a DAG such as a ResNet block's diamond ``a → {b, c} → d``, whose tasks "use the outputs of their parent
tasks as inputs", Nona, Pit-Claudel et al., §I): a child listed with several parents, ``{"q/d": (("q/b", "q/c"), 1.0)}``, is
issued once per query, when the last of its parents finished — on time only if every parent was — due by the
latest parent's deadline plus its own budget. A query with a join is a job of tasks, each run once per query:
every edge of it has γ = 1 and issues exactly one child (no Poisson draw). Matching parents of one query needs
each finished request's query (``issue(..., queries=...)``: its root request's id), which both worlds track.
Nexus's Poisson(γ) chaining and its SLO split stay as they are for trees.

This is the one implementation: the simulator (``gpu.sim.nexus.engine``, virtual ms) and the serving runtime
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
from gpu.schedulers.nexus.profiles import TOL_MS

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


JOIN_SWEEP = 4096  # waiting joins held before the ones that can no longer be on time are forgotten


class QueryChains:
    """The stage DAG of every query and the stage budgets of the plan in force.

    Args:
        chains: ``{child stage session: (parent stage session, γ)}``; a join lists its parents as a tuple,
            ``(("q/b", "q/c"), 1.0)``.
        rng: the fan-out draws (a seed or a generator).
        time_unit: the world's clock, ``ms`` (floats) or ``ns`` (integers), see :data:`TICKS_PER_MS`.
    """

    def __init__(self, chains: Mapping[str, tuple[str, float]], rng: np.random.Generator | int = 0,
                 time_unit: str = "ms"):
        if time_unit not in TICKS_PER_MS:
            raise ConfigError("time_unit", time_unit, f"choose one of {list(TICKS_PER_MS)}")
        self.chains = dict(chains)
        self.inputs: dict[str, tuple[str, ...]] = {}  # child -> its parent stages
        self.children: dict[str, list[tuple[str, float]]] = {}
        for child, (parent, gamma) in self.chains.items():
            if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0):
                raise ConfigError(f"{child}.gamma", gamma, "must be a finite fan-out >= 0")
            parents = (parent,) if isinstance(parent, str) else tuple(parent)
            if not parents or len(set(parents)) != len(parents):
                raise ConfigError(f"{child}.parents", parents, "need one or more distinct parent stages")
            self.inputs[child] = parents
            for p in parents:
                self.children.setdefault(p, []).append((child, float(gamma)))
        for child, parents in self.inputs.items():
            if any(p == child or self._has_ancestor(p, child) for p in parents):
                raise ConfigError("chains", child, f"a stage cannot be its own ancestor (parents {list(parents)})")
        self.parents = frozenset(self.children)
        self.roots = {sid: self._top(sid) for sid in [*self.children, *self.chains]}  # stage -> its query's root
        self.joins = frozenset(c for c, ps in self.inputs.items() if len(ps) > 1)
        for join in self.joins:
            tops = {self.roots[p] for p in self.inputs[join]}
            if len(tops) != 1:
                raise ConfigError(f"{join}.parents", list(self.inputs[join]), "a join's parents must be stages of "
                                                                               "one query")
        dag_roots = {self.roots[j] for j in self.joins}
        self.exact = frozenset(c for c in self.chains if self.roots[c] in dag_roots)  # issued once per query
        for child in self.exact:
            if self.chains[child][1] != 1:
                raise ConfigError(f"{child}.gamma", self.chains[child][1], "a query with a join runs each stage once "
                                                                           "per query: γ must be 1")
        self._dag_parents = frozenset(p for c in self.exact for p in self.inputs[c])
        self._waiting: dict[tuple[str, int], list] = {}  # (join, query) -> [parents arrived, all on time, deadline]
        self.time_unit = time_unit
        self._per_ms = TICKS_PER_MS[time_unit]
        self._tol = TOL_MS * self._per_ms  # on time: finish <= deadline + TOL_MS, as ``nexus_profiles.fits``
        self._budget: dict[str, float | int] = {}
        self._rng = np.random.default_rng(rng)
        self._fanouts: dict[str, tuple[np.ndarray, int]] = {}  # child -> (pre-drawn fan-outs, next unused)
        self._lock = threading.Lock()  # the runtime issues from every worker thread

    def _has_ancestor(self, sid: str, ancestor: str) -> bool:
        seen, todo = set(), [sid]
        while todo:
            u = todo.pop()
            for p in self.inputs.get(u, ()):
                if p == ancestor:
                    return True
                if p not in seen:
                    seen.add(p)
                    todo.append(p)
        return False

    def _top(self, sid: str) -> str:
        while sid in self.inputs:
            sid = self.inputs[sid][0]
        return sid

    def depth(self, sid: str) -> int:
        """Number of stages on the longest path above ``sid``."""
        return 0 if sid not in self.inputs else 1 + max(self.depth(p) for p in self.inputs[sid])

    def set_plan(self, plan, ready_ms: Mapping[str, float] | None = None) -> None:
        """Take the stage budgets of ``plan`` (a ``gpu.schedulers.nexus.squishy.Plan``): a session's SLO plus the CPU
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

    def issue(self, now: float | int, session_id: str, deadlines: np.ndarray | float | int,
              queries: np.ndarray | None = None) -> tuple[Issue, ...]:
        """The children of a batch of stage ``session_id`` that finished at ``now`` (its requests' ``deadlines``).

        Only parents that finished on time issue; a stage with no children issues nothing. ``queries``: each
        request's query (its root request's id), needed when a child is a join; a join's ``Issue.parents``
        names the request whose arrival completed it.
        """
        kids = self.children.get(session_id)
        if not kids:
            return ()
        if type(deadlines) in (int, float) and session_id not in self._dag_parents:
            # a batch of one, the runtime's common case at low load: no mask
            if now > deadlines + self._tol:
                return ()
            fanouts = [(child, int(self._fanout(child, gamma, 1)[0])) for child, gamma in kids]
            return tuple(Issue(child, np.zeros(n, np.intp), np.full(n, deadlines + self.budget(child)))
                         for child, n in fanouts if n)
        due = np.atleast_1d(deadlines)
        on_time = now <= due + self._tol
        out = []
        for child, gamma in kids:
            if child in self.joins:
                if queries is None:
                    raise ConfigError("queries", None, f"{child!r} joins several stages: pass each request's query")
                idx, dl = self._join(now, child, due, on_time, np.atleast_1d(queries))
            else:
                n = on_time if child in self.exact else self._fanout(child, gamma, len(due)) * on_time
                idx = np.repeat(np.arange(len(due)), n)
                dl = due[idx]
            if len(idx):
                out.append(Issue(child, idx, dl + self.budget(child)))
        return tuple(out)

    def _join(self, now, child: str, due: np.ndarray, on_time: np.ndarray,
              queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Count one parent's arrival per request towards ``child``'s join of its query; the requests that
        completed a join on time and the join's deadlines (the latest parent's)."""
        need = len(self.inputs[child])
        done, dl = [], []
        with self._lock:
            for i, q in enumerate(queries.tolist()):
                entry = self._waiting.setdefault((child, q), [0, True, due[i]])
                entry[0] += 1
                entry[1] = entry[1] and bool(on_time[i])
                entry[2] = max(entry[2], due[i])
                if entry[0] == need:
                    del self._waiting[(child, q)]
                    if entry[1]:
                        done.append(i)
                        dl.append(entry[2])
            if len(self._waiting) > JOIN_SWEEP:  # parents dropped before finishing never arrive: forget the joins
                self._waiting = {k: e for k, e in self._waiting.items()  # that could no longer be on time
                                 if now <= e[2] + self.budget(k[0]) + self._tol}
        return np.asarray(done, np.intp), np.asarray(dl, due.dtype)
