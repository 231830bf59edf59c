"""Query DAGs served as DAGs: a finished stage request issues the next stage's requests.

Nexus §6.2 splits a query's latency SLO across its stages; at run time a stage's request is issued by its
parent's finished request and inherits its unused slack (the authors' ``request_context``, spec §3.4): the
child arrives when the parent's batch finishes and must finish by the parent's deadline plus its own stage
budget, so a root-to-leaf path ends by the query's arrival + its end-to-end SLO. Each finished, on-time
parent issues Poisson(γ) children (γ: the stage's fan-out, e.g. faces per frame), with the parent's input as
theirs (a crop of it, in a real pipeline); a dropped or late parent issues none — its query is bad already.
This is what ``gpu.sim.nexus_engine`` simulates; here real requests flow through the workers.

The chainer is the workers' ``on_done`` hook (``ServingWorker``), so children are issued on the thread that
ran the parent batch (``Frontend.chain``: its own id range); an idle worker runs them right there, and a
batch running inline serves what it issued to its own worker before it returns (no thread wake-up). No lock
is held while a child is pushed: that push may run a batch whose stage issues the next.
With the Ray backend each actor runs a chainer of its own (``tasks.serving.ray_backend``) and ships its parent
links back with its outcomes.
"""

from __future__ import annotations

import math
import threading
from typing import Callable, Iterable, Mapping

import numpy as np

from gpu.errors import ConfigError
from tasks.serving.frontend import Frontend
from tasks.serving.stats import Outcome


class QueryChainer:
    """Issues query stages' children and remembers each issued request's parent (``root``: its query's first
    request; parents, not roots, are stored because a child's own children may be issued before its push
    returns).

    Args:
        chains: ``{child stage session: (parent stage session, γ)}`` (``ServingSpec.chains()``).
        frontend: routes the children (``Frontend.chain``).
        seed: the fan-out draws.
    """

    def __init__(self, chains: Mapping[str, tuple[str, float]], frontend: Frontend, seed: int = 0):
        self.chains = dict(chains)
        self.children: dict[str, list[tuple[str, float]]] = {}
        for child, (parent, gamma) in chains.items():
            if not (math.isfinite(gamma) and gamma >= 0):
                raise ConfigError(f"{child}.gamma", gamma, "must be a finite fan-out >= 0")
            self.children.setdefault(parent, []).append((child, float(gamma)))
        self.parents = frozenset(self.children)
        self.frontend = frontend
        self.parent_of: dict[int, int] = {}
        self._budget_ns: dict[str, int] = {}
        self._rng = np.random.default_rng(seed)
        self._fanouts: dict[str, tuple[np.ndarray, int]] = {}  # child -> (pre-drawn Poisson(γ) fan-outs, next)
        self._lock = threading.Lock()

    def set_budgets(self, slo_ms: Mapping[str, float]) -> None:
        """The stages' budgets of the plan in force (its sessions' SLOs, ms)."""
        self._budget_ns = {c: round(slo_ms[c] * 1e6) for kids in self.children.values() for c, _ in kids
                           if c in slo_ms}

    def _fanout(self, child: str, gamma: float, k: int) -> np.ndarray:
        """The next ``k`` Poisson(γ) fan-outs of ``child`` (drawn 4096 at a time: a draw per request costs µs)."""
        with self._lock:
            block, at = self._fanouts.get(child, (np.empty(0, np.int64), 0))
            if at + k > len(block):
                block, at = np.concatenate([block[at:], self._rng.poisson(gamma, max(4096, k))]), 0
            self._fanouts[child] = block, at + k
        return block[at:at + k]

    def parent_done(self, session_id: str, ids: np.ndarray | int, deadline_ns: np.ndarray | int, finish_ns: int,
                    inputs) -> None:
        """A worker served a batch of stage ``session_id``: issue its on-time requests' children."""
        rows = inputs.numpy() if hasattr(inputs, "numpy") else np.asarray(inputs)
        if type(ids) is int:  # a batch of one, the common case at low load: no per-request arrays
            if deadline_ns < finish_ns:
                return
            for child, gamma in self.children[session_id]:
                n = int(self._fanout(child, gamma, 1)[0])
                if n:
                    issued = self.frontend.chain(child, rows if n == 1 else np.repeat(rows, n, 0), finish_ns,
                                                 deadline_ns + self._budget_ns.get(child, 0))
                    self.parent_of.update(dict.fromkeys(issued, ids))
            return
        on_time = deadline_ns >= finish_ns
        if not on_time.any():
            return
        for child, gamma in self.children[session_id]:
            idx = np.repeat(np.arange(len(ids)), self._fanout(child, gamma, len(ids)) * on_time)
            if len(idx):
                budget = self._budget_ns.get(child, 0)
                issued = self.frontend.chain(child, rows[idx], finish_ns, deadline_ns[idx] + budget)
                self.parent_of.update(zip(issued, ids[idx].tolist()))

    def root(self, request_id: int) -> int:
        """The first request of the query ``request_id`` belongs to (itself for a root stage's request)."""
        while request_id in self.parent_of:
            request_id = self.parent_of[request_id]
        return request_id


def query_bad_rate(outcomes: Iterable[Outcome], root_session: str, stage_sessions: Iterable[str],
                   root: Callable[[int], int]) -> tuple[int, float]:
    """(queries, bad rate) of one query over ``outcomes``: a query — one request of its root stage — is bad
    when that request or any request its stages issued for it was dropped or late (Nexus §7's unit)."""
    stages = set(stage_sessions)
    roots: set[int] = set()
    bad: set[int] = set()
    for o in outcomes:
        if o.session_id == root_session:
            roots.add(o.request_id)
            query = o.request_id
        elif o.session_id in stages:
            query = root(o.request_id)
        else:
            continue
        if not o.finish_ms <= o.deadline_ms:  # dropped (NaN) or late
            bad.add(query)
    return len(roots), len(bad & roots) / len(roots) if roots else 0.0
