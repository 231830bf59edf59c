"""Query DAGs served as DAGs on real workers: a finished stage request issues the next stage's requests.

Which children a finished batch issues and their deadlines is the Nexus controller's decision
(``gpu.schedulers.nexus.chaining``, Nexus §6.2: Poisson(γ) children per on-time parent, each due by its parent's
deadline plus its own stage budget), the one the simulator (``gpu.sim.nexus.engine``) asks too; here those
children become real requests with the parent's input as theirs (a crop of it, in a real pipeline), routed by
the frontend.

The chainer is the workers' ``on_done`` hook (``ServingWorker``), so children are issued on the thread that
ran the parent batch (``Frontend.chain``: its own id range); an idle worker runs them right there, and a
batch running inline serves what it issued to its own worker before it returns (no thread wake-up). No lock
is held while a child is pushed: that push may run a batch whose stage issues the next.
With the Ray backend each actor runs a chainer (and a controller) of its own (``tasks.serving.ray_backend``)
and ships its parent links back with its outcomes.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from gpu.schedulers.nexus.controller import NexusController
from tasks.serving.frontend import Frontend
from tasks.serving.stats import Outcome


JOIN_NODES_HELD = 1 << 16  # joins awaiting parents whose nodes are remembered before the memory is reset


class QueryChainer:
    """Turns the controller's chaining decisions into requests and remembers each issued request's parent
    (``root``: its query's first request), before the request is pushed: a child's own children may be issued
    while its push runs the batch, and they need their query.

    Args:
        controller: decides the children (its clock in ``ns``: the workers stamp ``perf_counter_ns``).
        frontend: routes the children (``Frontend.chain``).
    """

    def __init__(self, controller: NexusController, frontend: Frontend):
        self.controller = controller
        self.parents = controller.chains.parents
        chains = controller.chains
        self._joined = frozenset(p for j in chains.joins for p in chains.inputs[j])  # parents of a join
        self._joins_of = {p: [j for j in chains.joins if p in chains.inputs[j]] for p in self._joined}
        self._join_nodes: dict[tuple[str, int], list[int]] = {}  # (join, query) -> nodes its parents ran on
        self.frontend = frontend
        self.parent_of: dict[int, int] = {}

    def parent_done(self, session_id: str, ids: np.ndarray | int, deadline_ns: np.ndarray | int, finish_ns: int,
                    inputs, node: int | None = None) -> None:
        """A worker (on ``node``) served a batch of stage ``session_id``: issue its on-time requests' children,
        each with its query for joins and per-query routing, handed off from ``node``."""
        ids = np.atleast_1d(ids)
        need = session_id in self._joined or self.frontend.per_query
        queries = np.array([self.root(i) for i in ids.tolist()]) if need else None
        if session_id in self._joined and node is not None:
            self._note_join_parents(session_id, queries, node)
        issues = self.controller.chain(finish_ns, session_id, deadline_ns, queries)
        if not issues:
            return
        rows = inputs.numpy() if hasattr(inputs, "numpy") else np.asarray(inputs)
        for issue in issues:
            parents = ids[issue.parents].tolist()
            others = None
            if issue.session_id in self.controller.chains.joins and node is not None:
                others = [self._other_parents(issue.session_id, q, node) for q in queries[issue.parents].tolist()]
            self.frontend.chain(issue.session_id, rows[issue.parents], finish_ns, issue.deadlines,
                                None if queries is None else queries[issue.parents], node,
                                lambda issued, parents=parents: self.parent_of.update(zip(issued, parents)), others)

    def _note_join_parents(self, session_id: str, queries: np.ndarray, node: int) -> None:
        """Remember where a join's parents ran, so its hand-offs from every parent's node can be charged."""
        if len(self._join_nodes) > JOIN_NODES_HELD:  # joins whose last parent was dropped never complete
            self._join_nodes.clear()
        for join in self._joins_of[session_id]:
            for q in queries.tolist():
                self._join_nodes.setdefault((join, q), []).append(node)

    def _other_parents(self, join: str, query: int, node: int) -> list[int]:
        """The nodes the join's other parents ran on (the one completing it ran on ``node``)."""
        nodes = self._join_nodes.pop((join, query), [node])
        nodes.remove(node)
        return nodes

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
