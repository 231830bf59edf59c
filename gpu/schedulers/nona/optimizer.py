"""Nona's offline optimisation: the bottleneck link as an M/G/1 queue and θ per subgraph (§III-C, §III-D, §IV-F).

Pit-Claudel et al., "Nona: A Stochastic Congestion-Aware Job Scheduler for Real-Time Inference Queries".
For every query class j (a contracted DAG arriving at Poisson rate β_j) and every subgraph root t, θ_t is a
probability distribution over the groupings Ω_t (``gpu.schedulers.nona.dag``). Given θ:

* (IV)  λ_(t,t') = β_j Σ_ω θ_t[ω]·x_ω(t,t')  — a transfer happens when the grouping splits the edge;
* (V)   S = b/μ;  (VI) ρ = Σ λS (+ background transfers);  (VII) ρ < 1;
* (VIII) φ = Σ λS² / (2(1−ρ))  — Pollaczek–Khinchine mean wait of a Poisson mix of deterministic sizes;
* (IX)  c = φ + S;  (X) χ of a part = its compute plus its remote transfers in and to the sink, run serially;
* (XI)  κ_t = Σ_ω θ_t[ω]·max(χ over parts, the direct source→sink transfer) + p^sink/ν;
* (XII) τ_j = p^{t_0}/ν + Σ_t κ_t;  (I) objective Σ_j β_j τ_j (+ background jobs' times).

The printed (VIII) and (X) are garbled; we use the standard M/G/1 numerator and read (X) as above (see
``docs/nona.md``). The objective is not convex (§III-C), so ``solve`` minimises it by multi-start L-BFGS over a
softmax per Ω_t (constraints II–III by construction) with a penalty Λ far above any JCT once ρ nears 1 (§IV-F's
Lagrangian relaxation), using the exact gradient. Solve time depends on Σ_j |ℛ^j|·|Ω| only, not on the number
of servers (§III-D, Table III).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import minimize

from gpu.errors import ConfigError
from gpu.schedulers.nona.dag import Dag, Grouping, Subgraph, groupings, subgraphs, undistributed

RHO_MARGIN = 1e-3  # θ must keep ρ ≤ 1 − RHO_MARGIN: a link at ρ → 1 has an unbounded wait


@dataclass(frozen=True)
class QueryClass:
    """A class of queries: one (contracted) DAG arriving at Poisson rate ``rate`` (β_j, per second)."""

    dag: Dag
    rate: float

    def __post_init__(self) -> None:
        if not np.isfinite(self.rate) or self.rate < 0:
            raise ConfigError(f"classes.{self.dag.name}.rate", self.rate, "must be a finite number >= 0")


@dataclass(frozen=True)
class Cluster:
    """N identical servers of ``nu`` ops/s and one bottleneck link of ``mu`` bytes/s (§III-B).

    Background jobs (§IV-A): single-task compute jobs of ``bg_compute_ops`` at ``bg_compute_rate`` per
    second, and transfers of ``bg_comm_bytes`` at ``bg_comm_rate`` per second; both count in the objective
    and the transfers load the link. ``compute_queueing`` (off in the paper's equations): a part that
    starts on another server, and a sink resuming after waiting for remote inputs, first wait for the task in
    service there, W = Σ rate·s² / (2N) (the PK residual of a server serving the oldest job first).
    """

    servers: int
    nu: float
    mu: float
    bg_compute_rate: float = 0.0
    bg_compute_ops: float = 0.0
    bg_comm_rate: float = 0.0
    bg_comm_bytes: float = 0.0
    compute_queueing: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.servers, bool) or not isinstance(self.servers, (int, np.integer)) or self.servers < 1:
            raise ConfigError("cluster.servers", self.servers, "must be a whole number >= 1")
        for name in ("nu", "mu"):
            v = getattr(self, name)
            if not np.isfinite(v) or v <= 0:
                raise ConfigError(f"cluster.{name}", v, "must be a finite number > 0")
        for name in ("bg_compute_rate", "bg_compute_ops", "bg_comm_rate", "bg_comm_bytes"):
            v = getattr(self, name)
            if not np.isfinite(v) or v < 0:
                raise ConfigError(f"cluster.{name}", v, "must be a finite number >= 0")

    @property
    def bg_rho(self) -> float:
        return self.bg_comm_rate * self.bg_comm_bytes / self.mu

    @property
    def bg_s2(self) -> float:
        """Background contribution to the PK numerator, λS²."""
        return self.bg_comm_rate * (self.bg_comm_bytes / self.mu) ** 2


@dataclass(frozen=True)
class _Block:
    """One subgraph compiled to arrays over Ω: the link load, λS² and per-part times of each grouping."""

    klass: int
    sub: Subgraph
    omega: tuple[Grouping, ...]
    load: np.ndarray    # (Ω,) Σ S over the edges a grouping sends over the link
    load2: np.ndarray   # (Ω,) Σ S²
    base: np.ndarray    # (Ω, P+1) compute + Σ S per part (last column: the direct source→sink transfer)
    remote: np.ndarray  # (Ω, P+1) transfers per part, each of which waits φ
    hops: np.ndarray    # (Ω, P+1) 1 where a part starts on a server other than the source's (waits W)
    resumes: np.ndarray  # (Ω,) 1 where the sink resumes after a gap (waits W)
    sink_time: float

    def times(self, phi: float, wait: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Each grouping's subgraph time before the sink, and how many φ it contains (for the gradient);
        ``wait`` is the compute residual W a part pays when it joins a server's queue."""
        total = self.base + self.remote * phi + self.hops * wait
        worst = np.argmax(total, axis=1)
        rows = np.arange(len(self.omega))
        return total[rows, worst] + self.resumes * wait, self.remote[rows, worst]


def _compile(k: int, dag: Dag, sub: Subgraph, cluster: Cluster) -> _Block:
    omega = groupings(sub, max_parts=cluster.servers)
    width = max(len(g.parts) for g in omega) + 1
    base = np.full((len(omega), width), -np.inf)
    remote, hops = np.zeros((len(omega), width)), np.zeros((len(omega), width))
    load, load2 = np.zeros(len(omega)), np.zeros(len(omega))
    S = {e: b / cluster.mu for e, b in dag.bytes.items()}
    r, z = sub.root, sub.sink
    for w, g in enumerate(omega):
        part = {t: i for i, p in enumerate(g.parts) for t in p}
        sent = [e for e in S if e[0] in part or e[1] in part or e == (r, z)]
        sent = [(a, b) for a, b in sent if _split(a, b, part, g, r, z)]
        load[w] = sum(S[e] for e in sent)
        load2[w] = sum(S[e] ** 2 for e in sent)
        base[w, -1], remote[w, -1] = (S[(r, z)], 1.0) if (r, z) in sent else (0.0, 0.0)
        for i, tasks in enumerate(g.parts):
            ins = [e for e in sent if e[1] in tasks or (e[0] in tasks and e[1] == z)]
            base[w, i] = sum(dag.op[t] for t in tasks) / cluster.nu + sum(S[e] for e in ins)
            remote[w, i] = len(ins)
            hops[w, i] = float(i != g.k)
    resumes = np.array([float(g.distributed) for g in omega])
    return _Block(k, sub, omega, load, load2, base, remote, hops, resumes, dag.op[z] / cluster.nu)


def _split(a: str, b: str, part: dict[str, int], g: Grouping, root: str, sink: str) -> bool:
    """x_ω(a, b) of (IV): whether the grouping puts the two ends of edge a → b on different servers."""
    side_a = g.k if a == root else g.l if a == sink else part[a]
    side_b = g.k if b == root else g.l if b == sink else part[b]
    return side_a != side_b


@dataclass(frozen=True)
class Prediction:
    """What the queueing model predicts for one θ: link load ρ, PK wait φ, mean JCT per class, objective."""

    rho: float
    phi: float
    jct: dict[str, float]
    objective: float


@dataclass(frozen=True)
class Solution:
    """θ per (class, subgraph root), aligned with that subgraph's Ω, and what the model predicts for it.

    Example: ``thetas[("f", "sum")] == (0.0, 0.31, 0.0, 0.0, 0.69)`` for the §II query at moderate load.
    """

    rates: dict[str, float]
    thetas: dict[tuple[str, str], tuple[float, ...]]
    prediction: Prediction
    solve_s: float = 0.0


class NonaModel:
    """The queueing model of one cluster and set of classes, compiled once; θ → prediction, objective, gradient.

    Args:
        classes: the query classes (contracted DAGs and their rates β_j).
        cluster: servers, ν, μ and background jobs.
    """

    def __init__(self, classes: Sequence[QueryClass], cluster: Cluster):
        names = [c.dag.name for c in classes]
        if len(set(names)) != len(names):
            raise ConfigError("classes", names, "class names must be unique")
        self.classes, self.cluster = tuple(classes), cluster
        self.blocks = [_compile(k, c.dag, sub, cluster) for k, c in enumerate(classes) for sub in subgraphs(c.dag)]
        self.sizes = [len(b.omega) for b in self.blocks]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.square_work = np.array([sum((p / cluster.nu) ** 2 for p in c.dag.ops) for c in classes])
        self.const_jct = np.array([c.dag.op[c.dag.source] / cluster.nu
                                   + sum(b.sink_time for b in self.blocks if b.klass == k)
                                   for k, c in enumerate(classes)])

    @property
    def keys(self) -> list[tuple[str, str]]:
        return [(self.classes[b.klass].dag.name, b.sub.root) for b in self.blocks]

    def split(self, theta: np.ndarray) -> list[np.ndarray]:
        return [theta[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:])]

    def corner(self) -> np.ndarray:
        """θ that never distributes: every subgraph stays on its source's server (ρ from background only)."""
        theta = np.zeros(self.offsets[-1])
        for off, b in zip(self.offsets, self.blocks):
            theta[off + undistributed(b.omega)] = 1.0
        return theta

    def rates(self, scale: Mapping[str, float] | None = None) -> np.ndarray:
        beta = np.array([c.rate for c in self.classes])
        if scale:
            beta = np.array([scale.get(c.dag.name, c.rate) for c in self.classes])
        return beta

    def residual(self, beta: np.ndarray) -> float:
        """W: mean compute a task joining a random server's queue waits for (0 unless ``compute_queueing``)."""
        if not self.cluster.compute_queueing:
            return 0.0
        c = self.cluster
        return float(beta @ self.square_work + c.bg_compute_rate * (c.bg_compute_ops / c.nu) ** 2) / (2 * c.servers)

    def compute_load(self, beta: np.ndarray) -> float:
        """u: the servers' mean utilisation, Σ_j β_j S_j / N plus background compute (§IV-A's load, normalised by N)."""
        c = self.cluster
        work = sum(b * cl.dag.total_ops for b, cl in zip(beta, self.classes)) + c.bg_compute_rate * c.bg_compute_ops
        return float(work / c.nu / c.servers)

    def arrival_wait(self, beta: np.ndarray) -> float:
        """A query's wait at its root's server before it starts, W/(1 − u) (M/G/1), when ``compute_queueing``;
        the same for every θ, so it moves predictions, not decisions."""
        if not self.cluster.compute_queueing:
            return 0.0
        u = self.compute_load(beta)
        return self.residual(beta) / (1 - u) if u < 1 else np.inf

    def link(self, theta: np.ndarray, beta: np.ndarray) -> tuple[float, float]:
        """(ρ, Σ λS²) of (VI) and (VIII)'s numerator."""
        rho, s2 = self.cluster.bg_rho, self.cluster.bg_s2
        for b, th in zip(self.blocks, self.split(theta)):
            rho += beta[b.klass] * float(th @ b.load)
            s2 += beta[b.klass] * float(th @ b.load2)
        return rho, s2

    def predict(self, theta: np.ndarray, beta: np.ndarray | None = None) -> Prediction:
        """ρ, φ (∞ when ρ ≥ 1), τ_j per class and Σβτ for θ (a flat vector over all Ω, see ``offsets``)."""
        beta = self.rates() if beta is None else beta
        rho, s2 = self.link(theta, beta)
        if rho >= 1:
            return Prediction(rho, np.inf, {c.dag.name: np.inf for c in self.classes}, np.inf)
        phi = s2 / (2 * (1 - rho))
        jct, wait = self.const_jct + self.arrival_wait(beta), self.residual(beta)
        for b, th in zip(self.blocks, self.split(theta)):
            jct[b.klass] += float(th @ b.times(phi, wait)[0])
        bg = self.cluster.bg_comm_rate * (phi + self.cluster.bg_comm_bytes / self.cluster.mu) \
            + self.cluster.bg_compute_rate * self.cluster.bg_compute_ops / self.cluster.nu
        objective = float(beta @ jct) + bg
        return Prediction(rho, phi, {c.dag.name: float(j) for c, j in zip(self.classes, jct)}, objective)

    def objective_and_gradient(self, theta: np.ndarray, beta: np.ndarray, penalty: float) -> tuple[float, np.ndarray]:
        """Σβτ (+ background) and its exact gradient in θ; past ρ = 1 − RHO_MARGIN, ``penalty``·(1 + excess)."""
        rho, s2 = self.link(theta, beta)
        grad = np.zeros_like(theta)
        limit = 1 - RHO_MARGIN
        if rho >= limit:
            for b, off in zip(self.blocks, self.offsets):
                grad[off:off + len(b.omega)] = penalty * beta[b.klass] * b.load
            return penalty * (1 + rho - limit), grad
        phi = s2 / (2 * (1 - rho))
        value = float(beta @ (self.const_jct + self.arrival_wait(beta))) + self.cluster.bg_comm_rate * (phi + self.cluster.bg_comm_bytes / self.cluster.mu)
        waits, wait = self.cluster.bg_comm_rate, self.residual(beta)  # ∂objective/∂φ, W
        for b, off, th in zip(self.blocks, self.offsets, self.split(theta)):
            t, n_phi = b.times(phi, wait)
            value += beta[b.klass] * float(th @ t)
            grad[off:off + len(b.omega)] = beta[b.klass] * t
            waits += beta[b.klass] * float(th @ n_phi)
        for b, off in zip(self.blocks, self.offsets):  # ∂φ/∂θ through λ (IV) in ρ and in Σ λS²
            dphi = beta[b.klass] * (b.load2 / (2 * (1 - rho)) + s2 * b.load / (2 * (1 - rho) ** 2))
            grad[off:off + len(b.omega)] += waits * dphi
        return value, grad


def solve(model: NonaModel, rates: Mapping[str, float] | None = None, *, starts: int = 4, seed: int = 0) -> Solution:
    """θ minimising Σβτ under ρ < 1 (§III-C) for ``rates`` (default: the classes' own), multi-start L-BFGS.

    Raises ``ConfigError`` naming the classes, rates and μ when even never distributing leaves ρ ≥ 1 (the
    background transfers alone saturate the link).
    """
    t0 = time.perf_counter()
    beta = model.rates(rates)
    corner = model.corner()
    base = model.predict(corner, beta)
    if model.cluster.compute_queueing and model.compute_load(beta) >= 1:
        named = {c.dag.name: float(r) for c, r in zip(model.classes, beta)}
        raise ConfigError("rates", named, f"the servers cannot keep up: compute load "
                                          f"{model.compute_load(beta):.3g} ≥ 1 on {model.cluster.servers} servers")
    if base.rho >= 1 - RHO_MARGIN:
        named = {c.dag.name: float(r) for c, r in zip(model.classes, beta)}
        raise ConfigError("rates", named, f"no θ keeps the link stable: ρ = {base.rho:.3g} ≥ 1 even with no "
                                          f"query distributed, at μ = {model.cluster.mu:g} B/s")
    penalty = 1e3 * max(base.objective, 1e-9)
    rng = np.random.default_rng(seed)
    best, best_value = corner, base.objective
    if model.offsets[-1] > len(model.blocks):  # some subgraph has a real choice
        logits0 = [np.log(np.maximum(corner, 1e-6)), np.zeros_like(corner)]
        logits0 += [rng.normal(0, 2, corner.size) for _ in range(max(0, starts - 2))]
        for z0 in logits0:
            res = minimize(_softmax_objective, z0, args=(model, beta, penalty), jac=True, method="L-BFGS-B",
                           options={"maxiter": 500})
            theta = _softmax(model, res.x)
            value = model.predict(theta, beta).objective
            if value < best_value:
                best, best_value = theta, value
    thetas = {key: tuple(float(x) for x in th) for key, th in zip(model.keys, model.split(best))}
    return Solution({c.dag.name: float(r) for c, r in zip(model.classes, beta)}, thetas,
                    model.predict(best, beta), time.perf_counter() - t0)


def _softmax(model: NonaModel, z: np.ndarray) -> np.ndarray:
    out = np.empty_like(z)
    for a, b in zip(model.offsets[:-1], model.offsets[1:]):
        e = np.exp(z[a:b] - z[a:b].max())
        out[a:b] = e / e.sum()
    return out


def _softmax_objective(z: np.ndarray, model: NonaModel, beta: np.ndarray, penalty: float) -> tuple[float, np.ndarray]:
    theta = _softmax(model, z)
    value, g = model.objective_and_gradient(theta, beta, penalty)
    grad = np.empty_like(z)
    for a, b in zip(model.offsets[:-1], model.offsets[1:]):
        grad[a:b] = theta[a:b] * (g[a:b] - theta[a:b] @ g[a:b])
    return value, grad


def theta_vector(model: NonaModel, solution: Solution | Mapping[tuple[str, str], Sequence[float]]) -> np.ndarray:
    """A solution's θ (or θ per ``(class, subgraph root)``, e.g. a baseline's) as the model's flat vector (for
    ``predict``)."""
    thetas = solution.thetas if isinstance(solution, Solution) else solution
    return np.concatenate([np.asarray(thetas[key]) for key in model.keys])


@dataclass(frozen=True)
class LookupTable:
    """θ solved for several predicted arrival-rate scenarios (§III-A); the online scheduler uses the entry that
    best matches the measured rates (largest relative rate error smallest)."""

    entries: tuple[Solution, ...] = field(default_factory=tuple)

    def nearest(self, rates: Mapping[str, float]) -> tuple[int, float]:
        """Index of the best entry and its largest relative rate error |log(measured/planned)|."""
        if not self.entries:
            raise ConfigError("table", self.entries, "the lookup table is empty: solve at least one scenario")
        errors = [max((abs(np.log(max(rates.get(k, v), 1e-12) / max(v, 1e-12))) for k, v in e.rates.items()),
                      default=0.0) for e in self.entries]
        best = int(np.argmin(errors))
        return best, float(errors[best])


def solve_table(model: NonaModel, scales: Sequence[float], *, starts: int = 4, seed: int = 0) -> LookupTable:
    """One solution per scale of the classes' rates (e.g. 0.5×, 1×, 1.5×), skipping scales no θ can keep
    stable."""
    entries = []
    for s in scales:
        try:
            entries.append(solve(model, {c.dag.name: c.rate * s for c in model.classes}, starts=starts, seed=seed))
        except ConfigError:
            continue
    return LookupTable(tuple(entries))
