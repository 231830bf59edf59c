"""Query DAGs for Nona: tasks with compute ops, edges with bytes, contraction, bottlenecks and groupings.

Nona (Pit-Claudel et al., "Nona: A Stochastic Congestion-Aware Job Scheduler for Real-Time Inference
Queries") places each query class's DAG by sampling *groupings* of tasks onto servers. This module holds the
graph side of that model:

* ``Dag`` — tasks with ops ``p^t`` and edges with bytes ``b^(t,t')`` (§III-C), one source and one sink;
* ``contract`` — Technique 1 (§III-D): contract every edge of 𝒞 in each round until none is left; merged
  tasks add their ops, parallel edges created by a merge add their bytes;
* ``subgraphs`` — the DAG cut at its bottleneck nodes ("nodes that are on every root-to-sink path");
* ``groupings`` — Ω_t, every triplet (π, π_k, π_l): a partition π of the subgraph's intermediate tasks, the
  part π_k that shares the source's server and the part π_l that shares the sink's. |Ω| = Σ_k S(n, k)·k²
  (Stirling numbers of the second kind): 5, 22, 99 for 2, 3, 4 intermediates.

Example: the motivating query of §II (Fig. 1), f(A, B) = det(A+B) + det(r(A+B)), is a diamond
``sum -> {det, det_sparse} -> add``; its one subgraph has 2 intermediates and 5 groupings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from gpu.errors import ConfigError


@dataclass(frozen=True)
class Dag:
    """One query class's task graph (§III-C): ``ops[t]`` = p^t, ``edges[(t, t')]`` = b^(t,t') in bytes.

    Tasks keep their given order; edges point from producer to consumer. Validated at construction: unknown
    tasks, negative ops or bytes, cycles, and more than one source or sink (a query has one input and one
    output) are ``ConfigError``s naming the field.

    Example: ``Dag.build("f", {"a": 1, "b": 10, "c": 1}, {("a", "b"): 1e8, ("b", "c"): 1e8})``.
    """

    name: str
    tasks: tuple[str, ...]
    ops: tuple[float, ...]
    edges: tuple[tuple[str, str, float], ...]

    @classmethod
    def build(cls, name: str, ops: Mapping[str, float], edges: Mapping[tuple[str, str], float]) -> Dag:
        """A DAG from ``{task: ops}`` and ``{(producer, consumer): bytes}`` mappings."""
        return cls(str(name), tuple(str(t) for t in ops), tuple(float(v) for v in ops.values()),
                   tuple((str(a), str(b), float(v)) for (a, b), v in edges.items()))

    def __post_init__(self) -> None:
        where = f"classes.{self.name}"
        if not self.tasks:
            raise ConfigError(f"{where}.tasks", self.tasks, "a DAG needs at least one task")
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"{where}.tasks", self.tasks, "task names must be unique")
        for t, p in zip(self.tasks, self.ops):
            if not np.isfinite(p) or p < 0:
                raise ConfigError(f"{where}.tasks.{t}", p, "ops must be a finite number >= 0")
        known, seen = set(self.tasks), set()
        for a, b, size in self.edges:
            for end in (a, b):
                if end not in known:
                    raise ConfigError(f"{where}.edges", (a, b), f"unknown task {end!r}")
            if a == b or (a, b) in seen:
                raise ConfigError(f"{where}.edges", (a, b), "self-loops and repeated edges are not allowed")
            seen.add((a, b))
            if not np.isfinite(size) or size < 0:
                raise ConfigError(f"{where}.edges", (a, b, size), "bytes must be a finite number >= 0")
        if len(self.topological_order) != len(self.tasks):
            raise ConfigError(f"{where}.edges", self.edges, "the graph has a cycle")
        for name, found in (("source", self.sources), ("sink", self.sinks)):
            if len(found) != 1:
                raise ConfigError(f"{where}.edges", found, f"a query DAG needs exactly one {name}")

    @functools.cached_property
    def op(self) -> dict[str, float]:
        return dict(zip(self.tasks, self.ops))

    @functools.cached_property
    def bytes(self) -> dict[tuple[str, str], float]:
        return {(a, b): s for a, b, s in self.edges}

    @functools.cached_property
    def preds(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {t: [] for t in self.tasks}
        for a, b, _ in self.edges:
            out[b].append(a)
        return {t: tuple(v) for t, v in out.items()}

    @functools.cached_property
    def succs(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {t: [] for t in self.tasks}
        for a, b, _ in self.edges:
            out[a].append(b)
        return {t: tuple(v) for t, v in out.items()}

    @functools.cached_property
    def topological_order(self) -> tuple[str, ...]:
        """Kahn's order, ties in task order (shorter than ``tasks`` when there is a cycle)."""
        indeg = {t: len(self.preds[t]) for t in self.tasks}
        ready = [t for t in self.tasks if indeg[t] == 0]
        order = []
        while ready:
            t = ready.pop(0)
            order.append(t)
            for s in self.succs[t]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        return tuple(order)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(t for t in self.tasks if not self.preds[t])

    @property
    def sinks(self) -> tuple[str, ...]:
        return tuple(t for t in self.tasks if not self.succs[t])

    @property
    def source(self) -> str:
        return self.sources[0]

    @property
    def sink(self) -> str:
        return self.sinks[0]

    @property
    def total_ops(self) -> float:
        return float(sum(self.ops))


@dataclass(frozen=True)
class Contraction:
    """The result of Technique 1: the contracted DAG, which original tasks each node stands for, and rounds."""

    dag: Dag
    members: dict[str, tuple[str, ...]]
    rounds: int


def contractible_edges(dag: Dag) -> list[tuple[str, str]]:
    """𝒞 (§III-D): edges a → b where every other input of b is an input of a and every other output of a is an
    output of b — contracting them adds no dependency and removes no parallelism."""
    preds = {t: set(p) for t, p in dag.preds.items()}
    succs = {t: set(s) for t, s in dag.succs.items()}
    return [(a, b) for a, b, _ in dag.edges if preds[b] - {a} <= preds[a] and succs[a] - {b} <= succs[b]]


def contract(dag: Dag) -> Contraction:
    """Contract all of 𝒞 per round until 𝒞 is empty (§III-D, Fig. 2a); ops and parallel-edge bytes add up.

    A merged node keeps the name of its first member in topological order. Example: ResNet18's 71-node
    graph becomes 10 nodes in 2 rounds (Table II).
    """
    members = {t: (t,) for t in dag.tasks}
    rounds = 0
    while edges := contractible_edges(dag):
        rounds += 1
        parent = {t: t for t in dag.tasks}

        def find(t: str) -> str:
            while parent[t] != t:
                parent[t] = parent[parent[t]]
                t = parent[t]
            return t

        position = {t: i for i, t in enumerate(dag.topological_order)}
        for a, b in edges:
            ra, rb = find(a), find(b)
            if ra != rb:  # the group is named after its earliest task
                first, second = (ra, rb) if position[ra] < position[rb] else (rb, ra)
                parent[second] = first
        ops: dict[str, float] = {}
        for t in dag.topological_order:
            ops[find(t)] = ops.get(find(t), 0.0) + dag.op[t]
        new_edges: dict[tuple[str, str], float] = {}
        for a, b, size in dag.edges:
            key = (find(a), find(b))
            if key[0] != key[1]:
                new_edges[key] = new_edges.get(key, 0.0) + size
        grouped: dict[str, tuple[str, ...]] = {}
        for t in dag.topological_order:
            grouped[find(t)] = grouped.get(find(t), ()) + members[t]
        members = grouped
        dag = Dag.build(dag.name, ops, new_edges)
    return Contraction(dag, members, rounds)


def bottlenecks(dag: Dag) -> tuple[str, ...]:
    """Bottleneck nodes in topological order: tasks on every source-to-sink path (the source and sink included).

    A task is one when no edge jumps over it: with tasks numbered in topological order, every edge that starts
    before it ends at or before it. That holds for a task on every path and fails for any other (a path that
    avoids it must cross its position with one edge).
    """
    order = dag.topological_order
    position = {t: i for i, t in enumerate(order)}
    jumped = np.zeros(len(order) + 1)
    for a, b, _ in dag.edges:  # every position strictly between a and b is jumped over
        jumped[position[a] + 1] += 1
        jumped[position[b]] -= 1
    return tuple(t for t, over in zip(order, np.cumsum(jumped)) if over == 0)


@dataclass(frozen=True)
class Subgraph:
    """The tasks strictly between two consecutive bottleneck nodes: ``root`` (t_0), ``sink`` (𝒩(t_0)) and
    the intermediates T in topological order (§III-C)."""

    root: str
    sink: str
    intermediates: tuple[str, ...]


def subgraphs(dag: Dag) -> tuple[Subgraph, ...]:
    """The DAG divided along its bottleneck nodes (§III-C): one subgraph per pair of consecutive ones."""
    cut = bottlenecks(dag)
    position = {t: i for i, t in enumerate(dag.topological_order)}
    return tuple(Subgraph(r, z, tuple(t for t in dag.topological_order if position[r] < position[t] < position[z]))
                 for r, z in zip(cut, cut[1:]))


@dataclass(frozen=True)
class Grouping:
    """One triplet (π, π_k, π_l) of Ω_t: ``parts`` is π; the source's server runs ``parts[k]``, the sink's
    server runs ``parts[l]``; every part is on its own server (§III-C, Fig. 2b).

    Example: ``Grouping((("det", "det_sparse"),), 0, 0)`` keeps the whole diamond on one server.
    """

    parts: tuple[tuple[str, ...], ...]
    k: int
    l: int

    @property
    def distributed(self) -> bool:
        """Whether any task of the subgraph leaves the source's server."""
        return len(self.parts) > 1 or self.k != self.l


def set_partitions(items: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every partition of ``items`` (Bell(n) of them), parts in order of their first item."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for sub in set_partitions(rest):
        yield ((first,),) + sub
        for i in range(len(sub)):
            yield sub[:i] + ((first,) + sub[i],) + sub[i + 1:]


def groupings(sub: Subgraph, max_parts: int | None = None) -> tuple[Grouping, ...]:
    """Ω for one subgraph: every (π, π_k, π_l); ``max_parts`` drops partitions needing more servers than exist
    (one part per server). No intermediates → the single grouping that keeps the sink with the source."""
    if not sub.intermediates:
        return (Grouping((), 0, 0),)
    out = []
    for parts in set_partitions(sub.intermediates):
        if max_parts is not None and len(parts) > max_parts:
            continue
        parts = tuple(sorted(parts, key=lambda part: sub.intermediates.index(part[0])))
        out.extend(Grouping(parts, k, l) for k in range(len(parts)) for l in range(len(parts)))
    return tuple(out)


def undistributed(omega: tuple[Grouping, ...]) -> int:
    """Index of the grouping that keeps a whole subgraph on the source's server (no transfers at all)."""
    for i, g in enumerate(omega):
        if not g.distributed:
            return i
    raise ValueError("Ω has no undistributed grouping")


def branches(dag: Dag, sub: Subgraph) -> tuple[tuple[str, ...], ...]:
    """The parallel branches of a subgraph (Opportunistic's parts): the connected components of its intermediates
    once the ones every root-to-sink path inside it runs through are set aside; those serial tasks (GPT2's
    ``ln_1`` before q ∥ k ∥ v and the attention that joins them) go with the first branch. A skip edge straight
    from root to sink does not count as a path inside (it carries the residual, not a branch).

    Example: ResNet's diamond ``x → {downsample, conv1} → add`` → ``(("downsample",), ("conv1",))``; GPT2's block
    ``x → ln_1 → {q, k, v} → attn → add`` → ``(("ln_1", "q", "attn"), ("k",), ("v",))``."""
    inside = set(sub.intermediates)
    ends = (sub.root, sub.sink)
    inner = {(a, b): 1.0 for a, b, _ in dag.edges
             if (a in inside or a == sub.root) and (b in inside or b == sub.sink) and (a, b) != ends}
    cut = set(bottlenecks(Dag.build("inner", dict.fromkeys((sub.root, *sub.intermediates, sub.sink), 0.0), inner)))
    serial = [t for t in sub.intermediates if t in cut]
    parallel = [t for t in sub.intermediates if t not in cut]
    parent = {t: t for t in parallel}

    def find(t: str) -> str:
        while parent[t] != t:
            t = parent[t]
        return t

    for a, b in inner:
        if a in parent and b in parent:
            parent[find(b)] = find(a)
    comps: dict[str, tuple[str, ...]] = {}
    for t in parallel:
        comps[find(t)] = comps.get(find(t), ()) + (t,)
    parts = list(comps.values()) or [()]
    parts[0] = tuple(t for t in sub.intermediates if t in set(parts[0]) | set(serial))
    return tuple(parts)
