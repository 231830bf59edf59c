"""The serving frontend: stamps each request, routes it to a worker holding its session, counts rates.

Nexus §5 ("Data plane"): the global scheduler's routing table (``Plan.rate_shares()``: session → {node:
share}) is pushed to the frontends every epoch; each request goes to one of the session's backends in
proportion to the throughput allocated there, by the Nexus controller's ``Router``
(``gpu.schedulers.nexus.routing``: ``drr``, deficit round robin, the default, or ``weighted_random``) — the one
the simulator routes with.
The frontend also counts arrivals per session, which the epoch planner reads every beacon as the measured
request rate.

Applications: several clients may share a session (ORLOJ, Yu 2022 §4.3.2: "ORLOJ tags each request with its
originating application"). ``Frontend(apps={app: slo_ms or None})`` gives each application a code that rides
in the ring's ``app`` column to the worker, which hands it to the policy as ``Request.app_id``; an application
with its own SLO gets ``arrival + its SLO`` as deadline (the session's otherwise), so such a queue is no longer
deadline-ordered and needs an object policy (``LocalServingRuntime`` refuses a span policy then).

Per-query routing (``query_routing``, ``gpu.schedulers.nexus.routing.QueryRouting``): a seam keyed by each
request's query (its root request's id) that may send a query's stages where it chose — Nona's sampled
placement (``gpu.schedulers.nona.controller.NonaRouting``); the default follows the shares. Hand-offs: a request
a query stage issues knows the node its parent ran on; one issued to another node is a cross-node hand-off
(``handoffs`` / ``cross_node`` count them) and, with a ``link``, reaches its worker only after crossing it:
``handoff_bytes[child session]`` bytes per request (default: the bytes of its input row). On the socket link
(``tasks.serving.transport``) the child's input rows travel inside those bytes and the worker gets the rows
read back off the socket; the emulated one (``tasks.serving.link``) only delays them.

Example: shares {1: 2/3, 2: 1/3} → DRR over 300 requests sends 200 to node 1 and 100 to node 2.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Plan
from gpu.schedulers.nexus.routing import PlanShares, QueryRouting, Router
from tasks.serving.link import EmulatedLink
from tasks.serving.transport import SocketLink
from tasks.serving.ring import as_rows
from tasks.serving.stats import Recorder


CHAINED_IDS = 1 << 40  # first id of requests issued by query stages (``Frontend.chain``)


class Frontend:
    """Routes requests by the current plan's rate shares; one thread submits (the load generator's).

    A request is a row: ``submit_many`` stamps a burst once (``perf_counter_ns``, or the arrival times the
    caller read them at), gives it consecutive ids and writes it into the target workers' rings with array
    slices (``worker.push``) — no object per request. ``route_ns`` accumulates the wall time spent inside
    ``submit``/``submit_many`` (stamping, routing, enqueueing, and the batches run here for idle workers);
    with the workers' busy time, less every forward pass, it makes the runtime's dispatch overhead.
    """

    def __init__(self, recorder: Recorder, load_balancer: str = "drr", seed: int = 0, chained_ids: int = CHAINED_IDS,
                 router: Router | None = None, apps: Mapping[str, float | None] | None = None,
                 query_routing: QueryRouting | None = None, link: SocketLink | EmulatedLink | None = None,
                 handoff_bytes: Mapping[str, float] | None = None):
        self.apps = tuple(sorted(apps or {}))  # ring code k is ``apps[k - 1]``; 0 is "no application"
        self._app_code = {a: k for k, a in enumerate(self.apps, 1)}
        self._app_slo_ns: dict[int, int] = {}
        for a, slo in (apps or {}).items():
            if slo is not None:
                if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not 0 < slo < float("inf"):
                    raise ConfigError(f"apps.{a}.slo_ms", slo, "must be a finite number > 0 (or none: the session's)")
                self._app_slo_ns[self._app_code[a]] = round(float(slo) * 1e6)
        self.recorder = recorder
        self.router = router or Router(load_balancer, seed)  # the Nexus controller's, when a runtime has one
        self.load_balancer = self.router.kind
        # session → (SLO ns, its only worker or None, picker among several workers or None)
        self._routes: dict[str, tuple[int, Any, Any]] = {}
        self._next_id = 0
        self.counts: dict[str, int] = {}
        self.route_ns = 0
        self.submitted = 0
        # requests a finished query stage issues to the next (``chain``, from worker threads): their own lock
        # and id space, so the load generator's path stays lock-free
        self._chain_lock = threading.Lock()
        self._holding: list[Any] = []  # workers that can hold a turn's pushes (Ray handles)
        self._next_chained = chained_ids
        self.chained = 0
        self.query_routing = query_routing or PlanShares()
        self.per_query = not isinstance(self.query_routing, PlanShares)
        self.link = link
        self.handoff_bytes = dict(handoff_bytes or {})
        self._workers: dict[int, Any] = {}
        self.handoffs = 0    # parent → child edges of the requests query stages issued (a join: one per parent) ...
        self.cross_node = 0  # ... and those between two nodes (over the link, when there is one)

    def set_plan(self, plan: Plan, workers: Mapping[int, Any]) -> None:
        """Install the routing table of ``plan``; ``workers`` maps node id → the worker running it."""
        self.router.set_plan(plan)
        routes: dict[str, tuple[int, Any, Any]] = {}
        for s in plan.sessions:
            sid = s.session_id
            nodes, _ = self.router.nodes(sid)
            one, pick = None, None
            if len(nodes) == 1:
                one = workers[nodes[0]]
            elif nodes:
                pick = self.router.picker(sid, workers)
            routes[sid] = (round(float(s.slo_ms) * 1e6), one, pick)
            self.counts.setdefault(sid, 0)
        self.query_routing.set_hosts({s.session_id: self.router.nodes(s.session_id)[0] for s in plan.sessions})
        self._workers = dict(workers)
        self._routes = routes
        self._holding = [w for w in dict.fromkeys(workers.values()) if hasattr(w, "flush")]

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hand what is submitted inside to each remote worker in one call, at the end (one load-generator
        turn: its sessions' bursts to a Ray actor as one ``push_many`` instead of one Ray call each)."""
        held = self._holding
        for w in held:
            w.hold()
        try:
            yield
        finally:
            t0 = time.perf_counter_ns()
            for w in held:
                w.flush()
            self.route_ns += time.perf_counter_ns() - t0

    def app_code(self, app: str | None) -> tuple[int, int | None]:
        """``(ring code, own SLO in ns or None)`` of an application (``None``: no application, code 0)."""
        if app is None:
            return 0, None
        code = self._app_code.get(app)
        if code is None:
            raise ConfigError("app", app, f"not an application of this runtime ({list(self.apps)})")
        return code, self._app_slo_ns.get(code)

    def submit(self, session_id: str, x: Any, arrival_ns: int | None = None, app: str | None = None) -> int:
        """Accept one request (``x``: its input, a ``1×d`` or ``d`` array or CPU tensor); returns its id.

        ``arrival_ns``: when it arrived (``perf_counter_ns``; default now). A caller that was busy when the
        request was due — e.g. running a batch for an idle worker — passes the due time, so the wait counts
        in the request's latency and against its deadline (no coordinated omission). ``app``: the
        application that sent it (one of ``apps``), if any."""
        t0 = time.perf_counter_ns()
        route = self._routes.get(session_id)
        if route is None or route[1] is None or app is not None or self.per_query:  # the general path
            return self.submit_many(session_id, x, arrival_ns, app).start
        rid = self._next_id
        self._next_id = rid + 1
        a = t0 if arrival_ns is None else arrival_ns
        route[1].push(session_id, rid, a, a + route[0], x if type(x) is np.ndarray and x.ndim == 2 else as_rows(x))
        self.counts[session_id] += 1
        self.submitted += 1
        self.route_ns += time.perf_counter_ns() - t0
        return rid

    def submit_many(self, session_id: str, xs: Any, arrival_ns: np.ndarray | int | None = None,
                    app: str | None = None) -> range:
        """Accept requests of one session read together (one read of a socket, one turn of a load
        generator): ``xs`` their inputs, a ``k×d`` array or CPU tensor (or a sequence of rows); ``arrival_ns``
        one stamp for all, or their arrival times (int64, nondecreasing; default now). Returns their ids.
        One routing draw and one ring write (and doorbell or batch) per target worker; a planned session
        with no GPU (rate 0) is dropped. ``app``: the application that sent them, if any."""
        t0 = time.perf_counter_ns()
        route = self._routes.get(session_id)
        if route is None:
            raise ConfigError("session_id", session_id, f"not a session of the current plan ({sorted(self._routes)})")
        slo, one, pick = route
        code, app_slo = self.app_code(app)
        if app_slo is not None:
            slo = app_slo
        rows = as_rows(xs)
        k = len(rows)
        first = self._next_id
        ids = range(first, first + k)
        self._next_id = ids.stop
        arrival = t0 if arrival_ns is None else arrival_ns
        deadline = arrival + slo
        self.counts[session_id] += k
        nodes = self.query_routing.where(t0 / 1e9, session_id, np.arange(first, first + k)) if self.per_query else None
        self._dispatch(session_id, self._groups(one, pick, nodes, k), first, k, arrival, deadline, rows, code)
        self.submitted += k
        self.route_ns += time.perf_counter_ns() - t0
        return ids

    def chain(self, session_id: str, xs: np.ndarray, arrival_ns: int, deadline_ns: np.ndarray | int,
              queries: np.ndarray | None = None, from_node: int | None = None,
              record: Callable[[range], None] | None = None, others: list[list[int]] | None = None) -> range:
        """Requests of a query stage issued by its parent stage's finished requests (a worker's thread, while it
        records the parent batch): ``xs`` their inputs, ``arrival_ns`` the parent batch's finish, ``deadline_ns``
        one for all or one per request (the parent's deadline plus this stage's budget: unused slack carries
        over); ``queries``: each one's query (its root request's id), for per-query routing; ``from_node``:
        the node the parent batch ran on (a request sent elsewhere is a cross-node hand-off, over ``link``);
        ``record``: called with their ids before any is pushed (the chainer's parent links); ``others``: for a
        join, per request the nodes its other parents ran on (their outputs cross too). Returns their ids (a
        range apart from the load generator's)."""
        k = len(xs)
        if k == 1 and not isinstance(deadline_ns, int):  # a request alone takes the rings' scalar path: ints
            deadline_ns = int(deadline_ns[0])
        with self._chain_lock:  # ids, counts and the routing draw; the push goes outside (it may run the batch)
            first = self._next_chained
            self._next_chained = first + k
            self.counts[session_id] = self.counts.get(session_id, 0) + k
            self.chained += k
            _, one, pick = self._routes.get(session_id, (0, None, None))
            nodes = (self.query_routing.where(arrival_ns / 1e9, session_id, queries)
                     if self.per_query and queries is not None else None)
            groups = self._groups(one, pick, nodes, k)
            if record is not None:
                record(range(first, first + k))
            remote = None
            if from_node is not None:  # per group: how many parents' outputs each of its requests needs moved
                remote = [_remote(getattr(w, "node_id", from_node), from_node, others, mask, k) if w is not None
                          else np.zeros(k, int) for w, mask in groups]
                self.handoffs += k + (sum(map(len, others)) if others else 0)
                self.cross_node += sum(int(r.sum()) for r in remote)
        if remote is None or self.link is None:
            self._dispatch(session_id, groups, first, k, arrival_ns, deadline_ns, xs)
        else:
            self._hand_off(session_id, groups, remote, first, k, arrival_ns, deadline_ns, xs)
        return range(first, first + k)

    def _groups(self, one: Any, pick: Any, nodes: np.ndarray | None, k: int) -> list[tuple[Any, np.ndarray | None]]:
        """(worker, mask of the requests it gets or None for all) for ``k`` requests: by the per-query
        ``nodes``, else the session's only worker, else the shares' picks; ``(None, None)``: nothing hosts it."""
        if nodes is not None:
            return [(self._workers[int(n)], nodes == n) for n in np.unique(nodes)]
        if one is not None:
            return [(one, None)]
        if pick is not None:
            to = pick.pick_many(k)
            return [(target, to == j) for j, target in enumerate(pick.targets)]
        return [(None, None)]

    def _dispatch(self, session_id: str, groups: list, first: int, k: int, arrival: np.ndarray | int,
                  deadline: np.ndarray | int, rows: np.ndarray, app: int = 0) -> None:
        """Requests ``first .. first + k`` into the rings of their workers (``_groups``), with their
        application's code when they have one; dropped when the plan gives the session no GPU."""
        tag = {"app": app} if app else {}
        for target, mask in groups:
            if target is None:
                self.recorder.dropped(session_id, -1, np.arange(first, first + k), np.full(k, arrival, np.int64),
                                      np.full(k, deadline, np.int64))
            elif mask is None:
                target.push(session_id, first, arrival, deadline, rows, **tag)
            elif mask.any():
                target.push(session_id, np.arange(first, first + k)[mask], _part(arrival, mask),
                            _part(deadline, mask), rows[mask], **tag)

    def _hand_off(self, session_id: str, groups: list, remote: list[np.ndarray], first: int, k: int, arrival: int,
                  deadline: np.ndarray | int, rows: np.ndarray) -> None:
        """Push the requests whose inputs are all on their worker's node now; send the remote parents' outputs
        for each worker's others over the link as one transfer of their bytes (back-to-back transfers of one
        FIFO link end when the last does), with their input rows inside, and push those requests, with the rows
        that came through, when it has crossed."""
        per_row = float(self.handoff_bytes.get(session_id, rows[0].nbytes if k else 0))
        for (w, mask), moved in zip(groups, remote):
            mask = np.ones(k, bool) if mask is None else mask
            wait = mask & (moved > 0)
            if w is None or not wait.any():
                self._dispatch(session_id, [(w, mask)], first, k, arrival, deadline, rows)
                continue
            if (mask & ~wait).any():
                self._dispatch(session_id, [(w, mask & ~wait)], first, k, arrival, deadline, rows)
            ids, dl, xs = np.arange(first, first + k)[wait], _part(deadline, wait), np.ascontiguousarray(rows[wait])

            def deliver(received: bytes, w=w, ids=ids, dl=dl, dtype=xs.dtype, shape=xs.shape) -> None:
                w.push(session_id, ids, arrival, dl, np.frombuffer(received, dtype).reshape(shape))

            self.link.send(arrival, per_row * float(moved[wait].sum()), deliver, xs.tobytes())

    def add_chained(self, counts: Mapping[str, int]) -> None:
        """Count requests that query stages issued elsewhere (a Ray actor's frontend), per session."""
        with self._chain_lock:
            for sid, k in counts.items():
                self.counts[sid] = self.counts.get(sid, 0) + k
                self.chained += k

    def take_counts(self) -> dict[str, int]:
        """Arrivals per session since the last call (what a frontend reports every beacon)."""
        with self._chain_lock:
            out = dict(self.counts)
            for sid in out:
                self.counts[sid] = 0
        return out


def _remote(target: int, from_node: int, others: list[list[int]] | None, mask: np.ndarray | None,
            k: int) -> np.ndarray:
    """Per request (0 outside ``mask``): how many of its parents' outputs are on a node other than ``target``."""
    moved = np.full(k, int(target != from_node))
    if others:
        moved += np.array([sum(n != target for n in o) for o in others])
    return moved if mask is None else moved * mask


def _part(stamps: np.ndarray | int, mask: np.ndarray) -> np.ndarray | int:
    """The masked requests' stamps: one stamp for all stays one."""
    return stamps[mask] if isinstance(stamps, np.ndarray) else stamps
