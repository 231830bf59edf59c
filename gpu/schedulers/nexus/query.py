"""Complex-query SLO split: how a query's end-to-end SLO is divided among the models of its dataflow.

Nexus (Shen et al., SOSP'19) §6.2 (dynamic programming). For a tree-shaped query
(each stage invoked ``γ`` times per invocation of its parent) with end-to-end SLO ``L``, minimise the GPUs
``Σ_v R_v / T_v(L_v)`` subject to every root-to-leaf path's budgets summing to ≤ L. With the budget cut into
segments of ``ε`` ms::

    f(u, t) = min_{1 ≤ k ≤ t}  R_u / T_u(k·ε)  +  Σ_{v child of u} f(v, t − k)

``f`` is made non-increasing in t, so each child's best ``t' ≤ t − k`` equals ``f(v, t − k)``. The paper's
recursion uses ``k ≤ t`` (the authors' tool has a ``k < t`` quirk that wastes a leaf segment; not copied).
Baseline (§7.2): split the SLO evenly across the stages of the deepest path.

Example (Fig. 3/4): X → Y, L = 100 ms, γ = 0.1 → ``SloSplit(slo_ms={'X': 60, 'Y': 40}, gpus_per_rps=0.00367)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Session, _accounting
from gpu.schedulers.nexus.profiles import TOL_MS, Accounting, BatchProfile, fits

Throughput = Callable[[float], float]  # best requests/s of one GPU when the stage's budget is k ms


@dataclass(frozen=True)
class QueryStage:
    """One model invocation in a query; ``gamma`` = invocations per invocation of ``parent``."""

    name: str
    model: str
    parent: str | None = None
    gamma: float = 1.0


@dataclass(frozen=True)
class Query:
    """A tree of stages with one end-to-end SLO (ms), entered at ``rate`` requests/s at the root."""

    query_id: str
    stages: tuple[QueryStage, ...]
    slo_ms: float
    rate: float

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ConfigError(f"{self.query_id}.stages", names, "stage names must be unique")
        roots = [s.name for s in self.stages if s.parent is None]
        if len(roots) != 1:
            raise ConfigError(f"{self.query_id}.stages", roots, "need exactly one root stage (parent: null)")
        for s in self.stages:
            if s.parent is not None and s.parent not in names:
                raise ConfigError(f"{self.query_id}.{s.name}.parent", s.parent, "no such stage")
            if not s.gamma >= 0:
                raise ConfigError(f"{self.query_id}.{s.name}.gamma", s.gamma, "must be >= 0")
        if not self.slo_ms > 0:
            raise ConfigError(f"{self.query_id}.slo_ms", self.slo_ms, "must be > 0")
        if not self.rate >= 0:
            raise ConfigError(f"{self.query_id}.rate", self.rate, "must be >= 0 (requests/s)")
        self.order()  # raises on cycles

    @property
    def root(self) -> str:
        return next(s.name for s in self.stages if s.parent is None)

    def children(self, name: str) -> list[str]:
        return [s.name for s in self.stages if s.parent == name]

    def order(self) -> list[str]:
        """Stages root first (parents before children)."""
        out, frontier = [], [self.root]
        while frontier:
            u = frontier.pop()
            out.append(u)
            frontier += self.children(u)
        if len(out) != len(self.stages):
            raise ConfigError(f"{self.query_id}.stages", [s.name for s in self.stages], "parents form a cycle")
        return out

    def stage_rates(self) -> dict[str, float]:
        """R_v = root rate × product of γ along the path (§6.2)."""
        by = {s.name: s for s in self.stages}
        rates: dict[str, float] = {}
        for u in self.order():
            p = by[u].parent
            rates[u] = self.rate if p is None else rates[p] * by[u].gamma
        return rates

    def depth(self) -> int:
        by = {s.name: s for s in self.stages}
        levels: dict[str, int] = {}
        for u in self.order():
            p = by[u].parent
            levels[u] = 1 if p is None else levels[p] + 1
        return max(levels.values())


@dataclass(frozen=True)
class SloSplit:
    """Per-stage latency budgets (ms) and the GPUs they cost per unit of root rate's stage rates."""

    slo_ms: dict[str, float]
    gpus: float

    def sessions(self, query: Query) -> list[Session]:
        """The sessions the packer should place: one per stage, named ``query_id/stage``."""
        by = {s.name: s for s in query.stages}
        rates = query.stage_rates()
        return [Session(f"{query.query_id}/{u}", by[u].model, self.slo_ms[u], rates[u]) for u in query.order()]


def _stage_cost(rate: float, tput: float) -> float:
    if rate == 0:
        return 0.0
    return rate / tput if tput > 0 else math.inf


def split_slo(query: Query, throughput: Mapping[str, Throughput], epsilon_ms: float = 1.0) -> SloSplit:
    """The DP of §6.2: per-stage budgets minimising Σ R_v / T_v(L_v) within the end-to-end SLO."""
    if not epsilon_ms > 0:
        raise ConfigError("epsilon_ms", epsilon_ms, "must be > 0")
    for s in query.stages:
        if s.name not in throughput:
            raise ConfigError(f"{query.query_id}.{s.name}", s.name, "no throughput function for this stage")
    segs = int(math.floor(query.slo_ms / epsilon_ms + 1e-9))
    rates = query.stage_rates()
    f: dict[str, np.ndarray] = {}
    choice: dict[str, np.ndarray] = {}  # best k for budget t (after making f non-increasing)
    for u in reversed(query.order()):
        cost = np.array([math.inf] + [_stage_cost(rates[u], throughput[u](k * epsilon_ms)) for k in range(1, segs + 1)])
        kids = query.children(u)
        childsum = np.sum([f[v] for v in kids], axis=0) if kids else np.zeros(segs + 1)
        fu = np.full(segs + 1, math.inf)
        ku = np.zeros(segs + 1, dtype=int)
        for t in range(1, segs + 1):
            cand = cost[1:t + 1] + childsum[t - 1::-1][:t]
            j = int(np.argmin(cand))
            fu[t], ku[t] = cand[j], j + 1
            if fu[t - 1] <= fu[t]:  # keep f non-increasing: a smaller budget is never worse
                fu[t], ku[t] = fu[t - 1], ku[t - 1]
        f[u], choice[u] = fu, ku
    if not math.isfinite(f[query.root][segs]):
        raise ConfigError(f"{query.query_id}.slo_ms", query.slo_ms, "no split lets every stage meet its budget")
    budgets: dict[str, float] = {}
    todo = [(query.root, segs)]
    while todo:
        u, t = todo.pop()
        k = int(choice[u][t])
        budgets[u] = k * epsilon_ms
        todo += [(v, t - k) for v in query.children(u)]
    return SloSplit(_hand_out_slack(query, budgets), float(f[query.root][segs]))


def _hand_out_slack(query: Query, budgets: dict[str, float]) -> dict[str, float]:
    """Scale the budgets so the longest root-to-leaf path uses the whole SLO (inferred).

    Where throughput is flat in the budget (small models: their best batch fits in a few ms) the DP's
    smallest-budget tie-break leaves most of the SLO unused — e.g. 1 ms and 5 ms of a 40 ms query — and a
    stage with 1 ms cannot absorb a burst or a network hop. A larger budget never costs more (f is
    non-increasing), so scaling every stage by one factor keeps the DP's cost and every path within the SLO.
    """
    parent = {s.name: s.parent for s in query.stages}
    path: dict[str, float] = {}
    for u in query.order():  # parents before children
        path[u] = budgets[u] + (path[parent[u]] if parent[u] else 0.0)
    longest = max(path.values())
    scale = query.slo_ms / longest if longest > 0 else 1.0
    return {u: b * scale for u, b in budgets.items()}


def even_split(query: Query, throughput: Mapping[str, Throughput]) -> SloSplit:
    """Baseline: every stage gets L / depth (§7.2 "split the latency for a query evenly across its stages")."""
    share = query.slo_ms / query.depth()
    rates = query.stage_rates()
    return SloSplit({s.name: share for s in query.stages},
                    sum(_stage_cost(rates[s.name], throughput[s.name](share)) for s in query.stages))


def profile_throughput(profile: BatchProfile, accounting: str | Accounting = "paper",
                       rule: str = "worst_case") -> Throughput:
    """T(k): best one-GPU requests/s of a model whose latency budget is k ms.

    ``rule="worst_case"`` needs 2ℓ(b) + overheads ≤ k (keeps each stage SLO enforceable by the packer);
    ``rule="batch_latency"`` is the printed ``ℓ(b) ≤ k`` (reproduces Fig. 4).
    """
    acc = _accounting(accounting)
    if rule not in ("worst_case", "batch_latency"):
        raise ConfigError("rule", rule, "choose 'worst_case' or 'batch_latency'")
    lat = np.array([acc.latency(profile, b) for b in profile.batches])
    need = 2 * lat + acc.overhead(profile) + acc.network_ms if rule == "worst_case" else lat
    tput = 1000.0 * np.asarray(profile.batches) / lat
    order = np.argsort(need, kind="stable")
    need_sorted, best = need[order], np.maximum.accumulate(tput[order])

    def throughput(k_ms: float) -> float:
        i = int(np.searchsorted(need_sorted, k_ms + TOL_MS, side="right"))
        return float(best[i - 1]) if i > 0 else 0.0

    return throughput


def table_throughput(table: Mapping[float, float]) -> Throughput:
    """T(k) from a ``{latency_ms: requests/s}`` table: throughput of the largest latency ≤ k (Fig. 3)."""
    items: Sequence[tuple[float, float]] = sorted(table.items())

    def throughput(k_ms: float) -> float:
        fit = [t for lat, t in items if fits(lat, k_ms)]
        return max(fit) if fit else 0.0

    return throughput
