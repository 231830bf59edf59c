"""Nona's online scheduler: each query's placement sampled from θ, reading no live state (§III-A, §III-C).

"For each task in a job's DAG, Nona randomly samples a server from a pre-computed probability distribution
obtained from solving the optimization." Roots go to a uniformly random server ("the average load of every
server should be equal"); then, subgraph by subgraph, a grouping (π, π_k, π_l) ~ θ_t: part π_k joins the
source's server, the other parts go to distinct other servers chosen uniformly, and the sink follows π_l and
becomes the next subgraph's source. Tasks then run on their servers in DAG order.

* ``GroupingSampler`` — that rule for any θ (Nona, Nona*, Expert, Opportunistic, undistributed): a
  ``gpu.contract.DecisionPolicy`` from ``Query`` to a frozen ``QueryPlacement``. The random stream is seeded by
  (seed, query id), so the same query always gets the same placement.
* ``NonaController`` — the ``gpu.contract.Controller`` a world drives: ``on_arrival`` places a query;
  ``on_epoch`` takes measured rates (and, from a world that measures them, the tasks' service times) and
  switches to the nearest lookup-table entry, asking for a re-solve when none is within ``tolerance`` (the
  paper finds θ robust to ±40 % rate error, §IV-D) or when a task's measured time moved that far from the
  ``p^t/ν`` the table was solved with (§III-B's model takes both λ and the service times as inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.nona.optimizer import LookupTable, Solution
from gpu.schedulers.nona.dag import Dag, Grouping, groupings, subgraphs, undistributed


@dataclass(frozen=True)
class Query:
    """A query to place: its id (seeds its sample), its class and the servers alive now."""

    id: int
    klass: str
    servers: tuple[int, ...]


@dataclass(frozen=True)
class QueryPlacement:
    """Where every task of one query runs, and which grouping each subgraph drew.

    Example: ``QueryPlacement(7, "f", (("sum", 3), ("det", 3), ("det_sparse", 12), ("add", 3)), (1,))``.
    """

    query: int
    klass: str
    servers: tuple[tuple[str, int], ...]
    groupings: tuple[int, ...] = ()

    def server(self, task: str) -> int:
        for t, s in self.servers:
            if t == task:
                return s
        raise KeyError(task)

    @property
    def used(self) -> int:
        """How many servers the query spans (1 = undistributed)."""
        return len({s for _, s in self.servers})


class GroupingSampler:
    """Samples each query's placement from θ per (class, subgraph root) (§III-C, §III-A).

    Args:
        name: the policy's name (``nona``, ``nona_star``, ``opportunistic`` ...).
        dags: contracted DAG per class.
        thetas: θ per (class, subgraph root), aligned with ``groupings(subgraph, servers)``.
        servers: the cluster size θ was solved for (bounds the parts of a grouping).
        seed: mixes with each query id into that query's random stream.
    """

    def __init__(self, name: str, dags: Mapping[str, Dag], thetas: Mapping[tuple[str, str], Sequence[float]],
                 servers: int, seed: int = 0):
        self.name, self.seed = name, int(seed)
        self._plans: dict[str, list[tuple[str, str, tuple[Grouping, ...], np.ndarray]]] = {}
        for klass, dag in dags.items():
            plan = []
            for sub in subgraphs(dag):
                omega = groupings(sub, max_parts=servers)
                theta = np.asarray(thetas.get((klass, sub.root), ()), float)
                if theta.shape != (len(omega),) or theta.min() < -1e-9 or abs(theta.sum() - 1) > 1e-6:
                    raise ConfigError(f"theta.{klass}.{sub.root}", tuple(theta),
                                      f"must be {len(omega)} probabilities summing to 1")
                plan.append((sub.root, sub.sink, omega, np.clip(theta, 0, None) / np.clip(theta, 0, None).sum()))
            self._plans[klass] = plan
        self._dags = dict(dags)

    @classmethod
    def from_solution(cls, name: str, dags: Mapping[str, Dag], solution: Solution, servers: int,
                      seed: int = 0) -> GroupingSampler:
        return cls(name, dags, solution.thetas, servers, seed)

    def decide(self, query: Query) -> QueryPlacement:
        """Sample the query's placement; only ``query`` and the seed matter (no clock, no live state)."""
        if query.klass not in self._plans:
            raise ConfigError("query.klass", query.klass, f"unknown class; expected one of {sorted(self._plans)}")
        if not query.servers:
            raise ConfigError("query.servers", query.servers, "no live server to place the query on")
        rng = np.random.default_rng((self.seed, query.id))
        live = np.asarray(query.servers)
        where = {self._dags[query.klass].source: int(rng.choice(live))}
        drawn = []
        for root, sink, omega, theta in self._plans[query.klass]:
            theta = _within(omega, theta, len(live))
            w = int(rng.choice(len(omega), p=theta))
            drawn.append(w)
            g = omega[w]
            home = where[root]
            others = rng.permutation(live[live != home])[:max(0, len(g.parts) - 1)].tolist()
            part_server = [home if i == g.k else others.pop() for i in range(len(g.parts))]
            for tasks, s in zip(g.parts, part_server):
                where.update({t: s for t in tasks})
            where[sink] = part_server[g.l] if g.parts else home
        dag = self._dags[query.klass]
        return QueryPlacement(query.id, query.klass, tuple((t, where[t]) for t in dag.tasks), tuple(drawn))


def _within(omega: tuple[Grouping, ...], theta: np.ndarray, live: int) -> np.ndarray:
    """θ restricted to groupings that fit on the live servers (a node lost mid-run), else undistributed."""
    fits = np.array([len(g.parts) <= live for g in omega])
    if fits.all():
        return theta
    kept = np.where(fits, theta, 0.0)
    if kept.sum() <= 0:
        kept = np.zeros_like(theta)
        kept[undistributed(omega)] = 1.0
    return kept / kept.sum()


@dataclass(frozen=True)
class TableChoice:
    """``on_epoch``'s decision: the lookup-table entry now in force, its largest relative rate error, and
    whether the measured rates are far enough from every entry to re-solve (off the critical path)."""

    entry: int
    rate_error: float
    resolve: bool


class NonaController:
    """Nona as a ``gpu.contract.Controller``: places arrivals from the table entry in force.

    Args:
        dags: contracted DAG per class.
        table: θ per predicted rate scenario (``gpu.schedulers.nona.optimizer.solve_table``).
        servers: cluster size the table was solved for.
        tolerance: largest |log(measured/planned rate)| served without asking for a re-solve (≈ ±40 %).
    """

    system = "nona"
    hooks = ("on_arrival", "on_epoch")

    def __init__(self, dags: Mapping[str, Dag], table: LookupTable, servers: int, *, seed: int = 0,
                 tolerance: float = float(np.log(1.4)), policy: str = "nona"):
        if not table.entries:
            raise ConfigError("table", table.entries, "needs at least one solved scenario")
        self.policy, self.tolerance = policy, tolerance
        self._dags, self._servers, self._seed = dict(dags), servers, seed
        self.table = table
        self.entry = 0
        self._stale = False  # the table was solved for service times the world no longer measures
        self._sampler = GroupingSampler.from_solution(policy, dags, table.entries[0], servers, seed)

    @property
    def dags(self) -> dict[str, Dag]:
        return dict(self._dags)

    def on_arrival(self, now: float, query: Query) -> QueryPlacement:
        return self._sampler.decide(query)

    def on_epoch(self, now: float, rates: Mapping[str, float],
                  service_s: Mapping[str, Mapping[str, float]] | None = None) -> TableChoice:
        """Switch to the entry nearest the measured rates; a new θ takes effect from the next arrival.

        ``service_s``: per class, tasks' measured compute times (s on a server of ν = 1, the DAG's ``p^t``);
        one beyond ``tolerance`` of the DAG's makes the DAG take the measured times and the whole table stale:
        ``resolve`` then stays True until ``add_solution`` brings θ solved for them."""
        for klass, rate in rates.items():
            if not np.isfinite(rate) or rate < 0:
                raise ConfigError(f"rates.{klass}", rate, "must be a finite number >= 0")
        for klass, times in (service_s or {}).items():
            self._measured(klass, times)
        entry, error = self.table.nearest(rates)
        if entry != self.entry:
            self.entry = entry
            self._sampler = GroupingSampler.from_solution(self.policy, self._dags, self.table.entries[entry],
                                                          self._servers, self._seed)
        return TableChoice(entry, error, error > self.tolerance or self._stale)

    def _measured(self, klass: str, times: Mapping[str, float]) -> None:
        dag = self._dags.get(klass)
        if dag is None:
            raise ConfigError("service_s", klass, f"unknown class; expected one of {sorted(self._dags)}")
        ops = dag.op
        for task, s in times.items():
            if task not in ops or not (np.isfinite(s) and s > 0):
                raise ConfigError(f"service_s.{klass}.{task}", s, "must be a task of the class and a time > 0 s")
        if any(abs(np.log(s / ops[t])) > self.tolerance for t, s in times.items() if ops[t] > 0):
            self._dags[klass] = Dag.build(dag.name, {**ops, **times}, dag.bytes)
            self._stale = True

    def invalidate(self) -> None:
        """The world measured a cluster other than the one the table was solved for (e.g. the link's μ): the
        table is stale, ``on_epoch`` asks for a re-solve until ``add_solution`` brings θ solved for it."""
        self._stale = True

    def add_solution(self, solution: Solution) -> None:
        """Install a re-solved scenario (the world solved it after ``TableChoice.resolve``); a failed re-solve
        simply never calls this, so the table in force stays. Solved after the service times moved, it replaces
        the stale table and is in force at once."""
        if not self._stale:
            self.table = LookupTable(self.table.entries + (solution,))
            return
        self.table, self.entry, self._stale = LookupTable((solution,)), 0, False
        self._sampler = GroupingSampler.from_solution(self.policy, self._dags, solution, self._servers, self._seed)


class NonaRouting:
    """Nona as the serving frontend's per-query routing (``gpu.schedulers.nexus.routing.QueryRouting``).

    A query's first request (its root stage's) samples the query's placement from the table entry in force
    (``NonaController.on_arrival``, §III-C), among the nodes that host every stage of its class; each of its
    stage requests then goes to the node its task drew. The sample is seeded by (seed, the root request's id),
    so a query's stages, routed one by one as they are issued, all read the same placement.

    Args:
        controller: places arrivals (its classes are the DAGs' names): a ``NonaController``, or a baseline
            with the same ``on_arrival`` and ``dags`` (``gpu.schedulers.nona.baselines.RandomPlacement``).
        stages: serving session → (class, task), e.g. ``{"q/a": ("q", "a")}``; other sessions are left to
            their shares.
        cache: placements kept (a query's stages usually arrive within its SLO; one evicted is re-sampled
            identically).

    Example: ``where(0.0, "q/b", np.array([7, 8]))`` → ``array([2, 0])``.
    """

    def __init__(self, controller: NonaController | Any, stages: Mapping[str, tuple[str, str]], cache: int = 1 << 16):
        self.controller = controller
        self.stages = dict(stages)
        for sid, (klass, task) in self.stages.items():
            dag = controller.dags.get(klass)
            if dag is None or task not in dag.tasks:
                raise ConfigError(f"stages.{sid}", (klass, task), "names no task of the controller's DAGs")
        self._cache = cache
        self._servers: dict[str, tuple[int, ...]] = {}
        self._placed: dict[int, QueryPlacement] = {}

    def set_hosts(self, hosts: Mapping[str, Sequence[int]]) -> None:
        """Each class may use the nodes hosting all of its stages (none: its stages follow their shares)."""
        by_class: dict[str, set[int]] = {}
        for sid, (klass, _) in self.stages.items():
            nodes = set(hosts.get(sid, ()))
            by_class[klass] = by_class[klass] & nodes if klass in by_class else nodes
        self._servers = {k: tuple(sorted(v)) for k, v in by_class.items()}
        self._placed.clear()

    def where(self, now: float, session_id: str, queries: np.ndarray) -> np.ndarray | None:
        """The node each request of ``session_id`` goes to: its task's server in its query's placement."""
        stage = self.stages.get(session_id)
        if stage is None or not self._servers.get(stage[0]):
            return None
        klass, task = stage
        if len(self._placed) > self._cache:
            self._placed.clear()
        out = np.empty(len(queries), np.int64)
        for i, q in enumerate(np.asarray(queries).tolist()):
            placement = self._placed.get(q)
            if placement is None:
                placement = self.controller.on_arrival(now, Query(q, klass, self._servers[klass]))
                self._placed[q] = placement
            out[i] = placement.server(task)
        return out
