"""ORLOJ: distribution-aware batching for dynamic DNNs (P. Yu, *Application-Aware Scheduling in Deep Learning
Software Stacks*, PhD thesis, U. Michigan 2022, Ch. 4 "ORLOJ: Predictably Serving Unpredictable DNNs").

A dynamic DNN (early exits, skipped layers, decoding loops) gives each request a random execution time, and a
padded batch runs as long as its slowest request (Eq. 4.3/4.4). ORLOJ keeps an empirical execution-time
histogram per application, derives the batch-latency distribution ``L_B(bs)`` for every supported batch size
(§4.4.2, Eq. 4.5–4.9), scores each pending request by the expected cost it saves per unit of worker time if it
runs now rather than after an exponential anticipated delay (Eq. 4.1/4.2, after Chi et al., VLDB'13), and
forms each batch with Algorithm 4.1 (§4.4.3).

Implementation choices where the thesis is silent (``docs/orloj.md`` gives the reasons):

* ``L_B`` from the product of the slots' CDFs on one shared grid, ``F_max = ∏_j F_j``: the same density as the
  inclusion–exclusion sum of Eq. 4.8 (d/dl of the product), in O(k·grid) instead of O(2^k).
* Which application fills which slot (§4.4.3 "always use all execution time distributions associated with the
  model"): ``round_robin`` (slot j gets app (o + j) mod m, averaged over the m offsets o; default), ``iid`` (every slot draws from the equal mixture,
  Eq. 4.6) or ``request_aware`` (the request's own app in one slot, the mixture in the others).
* ``EstimateBatchLatency(r, bs)`` of Alg. 4.1 line 11 is ``E[L_B(bs)]``; candidate batch sizes are tried in the
  pseudocode's descending ``(D_Q, bs)`` order; a request no batch size can serve in time is dropped (line 14).
* Scores are evaluated from each request's slack ``D − t`` directly (overflow-free, an O(n·bins) numpy scan);
  the §4.4.4 line form ``p = α·e^{bt} + β`` with relative timestamps and base-time reset is
  :func:`line_coefficients`, which yields the same order.

Example: two apps with alone times U[10, 20] and U[40, 60] ms, ``c0 = 5`` ms: ``E[L_B(1)]`` ≈ 32.5 ms and
``E[L_B(2)] = 5 + 2·(E[max] − 5)`` ≈ 95 ms; a queue of two requests due in 200 ms runs as one batch of 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from gpu.batching import BatchContext, BatchDecision, InferenceRequest
from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.errors import ConfigError

MIXES = ("round_robin", "iid", "request_aware", "own_app")
PER_APP = ("request_aware", "own_app")  # mixes whose L_B depends on the request's application
RESET_EXPONENT = 100.0
"""Reset the base time once ``b·(t − base)`` passes this: e^100 ≈ 2.7e43 is far from float64 overflow (e^709),
and it is the thesis's own horizon (§4.4.4: b = 1e-4 per ms sustains "about 1000 s")."""


@dataclass(frozen=True, eq=False)
class Histogram:
    """An empirical execution-time distribution: bin ``edges`` (ms, increasing) and bin ``masses`` (sum 1).

    Time is uniform inside a bin, so the CDF is piecewise linear and the bin's density ``h`` of Eq. 4.2 is
    ``mass / width`` (a density, not a count: with counts the score would change with the bin width).
    """

    edges: np.ndarray
    masses: np.ndarray

    def __post_init__(self) -> None:
        edges = np.asarray(self.edges, float)
        masses = np.asarray(self.masses, float)
        if masses.ndim != 1 or masses.size == 0 or edges.shape != (masses.size + 1,):
            raise ConfigError("histogram", masses.tolist(), "need n >= 1 bin masses and n + 1 edges")
        if not (np.all(np.isfinite(edges)) and edges[0] >= 0 and np.all(np.diff(edges) > 0)):
            raise ConfigError("histogram.edges", edges.tolist(), "need finite, increasing edges >= 0 ms")
        if not (np.all(np.isfinite(masses)) and np.all(masses >= 0) and masses.sum() > 0):
            raise ConfigError("histogram.masses", masses.tolist(), "need masses >= 0 with a positive total")
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "masses", masses / masses.sum())

    @classmethod
    def from_samples(cls, samples: Sequence[float] | np.ndarray, bins: int = 200) -> "Histogram":
        """Equal-width bins over the observed range (a constant sample gets a ±0.1 % bin around it)."""
        x = np.asarray(samples, float)
        if x.size == 0 or not np.all(np.isfinite(x)) or x.min() < 0:
            raise ConfigError("histogram", x.tolist(), "need at least one finite execution time >= 0 ms")
        lo, hi = float(x.min()), float(x.max())
        if hi - lo <= 1e-9 * max(1.0, hi):
            lo, hi = lo * 0.999, hi * 1.001 + 1e-9
        counts, edges = np.histogram(x, bins=bins, range=(lo, hi))
        return cls(edges, counts)

    @property
    def density(self) -> np.ndarray:
        return self.masses / np.diff(self.edges)

    @property
    def mean(self) -> float:
        return float(self.masses @ (self.edges[:-1] + self.edges[1:]) / 2)

    def cdf(self, x: np.ndarray | float) -> np.ndarray:
        return np.interp(x, self.edges, np.concatenate([[0.0], np.cumsum(self.masses)]))

    def quantile(self, q: float) -> float:
        cum = np.concatenate([[0.0], np.cumsum(self.masses)])
        return float(np.interp(q, cum, self.edges))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws: a bin by its mass, then uniform inside it."""
        i = rng.choice(self.masses.size, size=n, p=self.masses)
        return rng.uniform(self.edges[i], self.edges[i + 1])

    @staticmethod
    def mixture(hists: Sequence["Histogram"]) -> "Histogram":
        """The equal-weight mixture of ``hists`` (the model-wide distribution), on the union of their edges."""
        edges = np.unique(np.concatenate([h.edges for h in hists]))
        cdf = np.mean([h.cdf(edges) for h in hists], axis=0)
        masses = np.diff(cdf)
        return Histogram(edges, np.where(masses > 0, masses, 0.0))


def max_cdf(slots: Sequence[Histogram], grid: np.ndarray) -> np.ndarray:
    """CDF of the longest of independent requests, one per slot: ``∏_j F_j`` on ``grid`` (Eq. 4.6–4.8)."""
    return np.prod([h.cdf(grid) for h in slots], axis=0)


def batch_latency(assignments: Sequence[Sequence[Histogram]], model: PaddedBatchModel,
                  points: int = 400) -> Histogram:
    """The batch-latency distribution ``L_B`` of a k-request batch, each slot drawing from its histogram.

    ``assignments`` lists equally likely slot assignments (k histograms each); the max's CDF is their average of
    ``∏_j F_j``. Eq. 4.9 is then a relabelling of the max's bins through Eq. 4.3 (``a ↦ c0 + k·(a − c0)``, or
    the model's measured growth for ``k``) with the masses of that CDF on a shared ``points``-cell grid.
    """
    hists = [h for slots in assignments for h in slots]
    lo, hi = max(model.c0, min(h.edges[0] for h in hists)), max(h.edges[-1] for h in hists)
    if model.c0 >= hi:
        raise ConfigError("c0", model.c0, f"at or above the longest alone time {hi:.4g} ms of the histograms")
    grid = np.linspace(lo, hi, points + 1)  # a request shorter alone than c0 does no work: it counts at c0
    cdf = np.mean([max_cdf(slots, grid) for slots in assignments], axis=0)
    masses = np.diff(cdf)
    masses[0] += cdf[0]
    k = len(assignments[0])
    return Histogram(model.fixed(k) + model.factor(k) * (grid - model.c0), np.clip(masses, 0.0, None))


@dataclass(frozen=True, eq=False)
class LatencyTable:
    """``L_B(bs)`` and ``E[L_B(bs)]`` per supported batch size, built off the critical path (§4.4.3).

    Keyed by ``(app, bs)`` for the ``request_aware`` mix and ``(None, bs)`` otherwise; an app without its own
    histogram uses the model-wide mixture.
    """

    histograms: Mapping[str, Histogram]
    batch_sizes: tuple[int, ...]
    model: PaddedBatchModel
    mix: str = "round_robin"
    points: int = 400
    latency: dict = field(init=False, repr=False)
    means: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.histograms:
            raise ConfigError("histograms", {}, "ORLOJ needs at least one application's execution-time histogram")
        if self.mix not in MIXES:
            raise ConfigError("mix", self.mix, f"choose one of {list(MIXES)}")
        if not self.batch_sizes or any(int(b) != b or b < 1 for b in self.batch_sizes):
            raise ConfigError("batch_sizes", self.batch_sizes, "need positive integer batch sizes")
        apps = sorted(self.histograms)
        wide = Histogram.mixture([self.histograms[a] for a in apps])
        table: dict[tuple[str | None, int], Histogram] = {}
        for bs in sorted(set(self.batch_sizes)):
            if self.mix == "round_robin":  # slot j of a batch gets app (o + j) mod m, every offset o alike
                rotations = [[self.histograms[apps[(o + j) % len(apps)]] for j in range(bs)]
                             for o in range(len(apps))]
                table[None, bs] = batch_latency(rotations, self.model, self.points)
            else:
                table[None, bs] = batch_latency([[wide] * bs], self.model, self.points)
            for a in apps if self.mix in PER_APP else ():
                others = [wide if self.mix == "request_aware" else self.histograms[a]] * (bs - 1)
                table[a, bs] = batch_latency([[self.histograms[a]] + others], self.model, self.points)
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(self.batch_sizes))))
        object.__setattr__(self, "latency", table)
        object.__setattr__(self, "means", {key: h.mean for key, h in table.items()})

    def key(self, app: str | None, bs: int) -> tuple[str | None, int]:
        return (app, bs) if self.mix in PER_APP and app in self.histograms else (None, bs)


def priority_scores(slack: np.ndarray, latency: Histogram, mean: float, b: float, cost: float = 1.0) -> np.ndarray:
    """Eq. 4.2 for requests ``slack = D − t`` ms before their deadline, with ``L = L_B`` and ``E[L] = mean``.

    Per bin ``[l1, l2]`` with density ``h``: ``p_i = (h·c/(E[L]·b))·(g(D − t − l1) − g(D − t − l2))`` with
    ``g(x) = 1 − e^{−bx}`` for x > 0 and 0 otherwise — the three cases of Eq. 4.2 in one expression, which
    only ever exponentiates negative numbers. Equals ``(c/E[L])·P(t + L ≤ D < t + τ + L)``, τ ~ Exp(b) (Eq. 4.1).
    """
    s = np.asarray(slack, float)[:, None]
    k = latency.density * cost / (mean * b)
    g1 = -np.expm1(-b * np.maximum(s - latency.edges[:-1], 0.0))
    g2 = -np.expm1(-b * np.maximum(s - latency.edges[1:], 0.0))
    return (g1 - g2) @ k


def step_cost_scores(slack: np.ndarray, latency: Histogram, mean: float, b: float,
                     steps: Sequence[tuple[float, float]]) -> np.ndarray:
    """Eq. 4.2 for a piece-wise step cost (Appendix C.2): the sum of single-step scores.

    ``steps`` = ``(offset, cost)`` pairs, increasing: missing ``D + offset`` costs ``cost`` in total; the step
    function is the sum of single steps at each offset with cost ``c_j − c_{j−1}``.
    """
    total = np.zeros(len(slack))
    prev = 0.0
    for offset, cost in steps:
        total += priority_scores(np.asarray(slack, float) + offset, latency, mean, b, cost - prev)
        prev = cost
    return total


def line_coefficients(deadline_rel: np.ndarray, t_rel: float, latency: Histogram, mean: float, b: float,
                      cost: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """§4.4.4's line form of Eq. 4.2: ``p = α·e^{b·t} + β`` valid until each request's next milestone.

    Times are relative to a base time (the caller resets it when ``b·t_rel`` passes ``RESET_EXPONENT``,
    recomputing every line, Alg. 4.1 lines 2–4). Returns ``(α, β, milestone_rel)``; the milestone is the first
    time after ``t_rel`` at which some bin changes case (Alg. 4.1 line 6).
    """
    d = np.asarray(deadline_rel, float)[:, None]
    l1, l2 = latency.edges[:-1], latency.edges[1:]
    k = latency.density * cost / (mean * b)
    s = d - t_rel
    before = s > l2  # case 1: t < D − l2
    during = (s > l1) & ~before  # case 2: D − l2 ≤ t < D − l1
    alpha = np.where(before, k * (np.exp(-b * (d - l2)) - np.exp(-b * (d - l1))), 0.0)
    alpha -= np.where(during, k * np.exp(-b * (d - l1)), 0.0)
    beta = np.where(during, k, 0.0)
    edge = np.where(before, d - l2, np.where(during, d - l1, np.inf))
    return alpha.sum(1), beta.sum(1), edge.min(1)


@dataclass(eq=False)
class OrlojPolicy:
    """ORLOJ's batch former (Algorithm 4.1) as a ``gpu.batching.BatchPolicy``; one instance per worker.

    Args:
        histograms: per application id, its alone-time histogram (ms); replaced by :meth:`update_histograms`
            when the profiler publishes new ones.
        model: the batch execution model (Eq. 4.3/4.4) of this model on this GPU.
        batch_sizes: the supported batch sizes ``S`` (capped per decision by ``ctx.max_batch``).
        b: rate of the anticipated delay τ ~ Exp(b), per ms (§4.4.4 uses 1e-4).
        mix: how applications fill a batch's slots (module docstring).
        cost_steps: the SLO cost function as ``(offset after the deadline, cumulative cost)`` steps
            (Fig. 4.5: one step of cost 1 at the deadline; Appendix C.2 for more).

    Example: ``decide`` on 20 requests with 200 ms of slack → ``BatchDecision(run=<the 16 best-scored>)`` when
    ``E[L_B(16)] ≤ 200`` ms, else the largest smaller size that fits.
    """

    histograms: Mapping[str, Histogram]
    model: PaddedBatchModel = field(default_factory=PaddedBatchModel)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    b: float = 1e-4
    mix: str = "round_robin"
    cost_steps: tuple[tuple[float, float], ...] = ((0.0, 1.0),)
    points: int = 400
    name: str = "orloj"
    table: LatencyTable = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (np.isfinite(self.b) and self.b > 0):
            raise ConfigError("b", self.b, "need a finite anticipated-delay rate > 0 per ms")
        offsets = [o for o, _ in self.cost_steps]
        costs = [c for _, c in self.cost_steps]
        if not self.cost_steps or offsets != sorted(set(offsets)) or offsets[0] < 0 or any(
                c <= 0 for c in np.diff([0.0, *costs])):
            raise ConfigError("cost_steps", self.cost_steps, "need (offset >= 0, cost) steps with increasing "
                              "offsets and increasing positive costs")
        self.update_histograms(self.histograms)

    def update_histograms(self, histograms: Mapping[str, Histogram]) -> None:
        """Adopt newly profiled histograms: rebuild ``L_B`` and ``E[L_B]`` for every batch size (§4.4.3)."""
        self.table = LatencyTable(dict(histograms), tuple(self.batch_sizes), self.model, self.mix, self.points)
        self.histograms = self.table.histograms

    def estimates(self, apps: Sequence[str], bs: int) -> np.ndarray:
        """``EstimateBatchLatency(r, bs)`` of Alg. 4.1 line 11 for each request's app: ``E[L_B(bs)]``."""
        if self.mix not in PER_APP:
            return np.full(len(apps), self.table.means[None, bs])
        names, which = np.unique(np.asarray(apps, dtype=object), return_inverse=True)
        return np.array([self.table.means[self.table.key(a, bs)] for a in names])[which]

    def scores(self, slack: np.ndarray, apps: Sequence[str], bs: int) -> np.ndarray:
        """Eq. 4.2 (summed over ``cost_steps``) of each request in ``Q_bs``, with ``L = L_B(bs)``."""
        if self.mix not in PER_APP:
            return step_cost_scores(slack, self.table.latency[None, bs], self.table.means[None, bs], self.b,
                                    self.cost_steps)
        out = np.empty(len(slack))
        names, which = np.unique(np.asarray(apps, dtype=object), return_inverse=True)
        for j, app in enumerate(names):
            key = self.table.key(app, bs)
            mask = which == j
            out[mask] = step_cost_scores(slack[mask], self.table.latency[key], self.table.means[key], self.b,
                                         self.cost_steps)
        return out

    def decide(self, queue: Sequence[InferenceRequest], ctx: BatchContext) -> BatchDecision:
        """One iteration of Algorithm 4.1: drop the hopeless, pick the batch size, pop the best-scored."""
        if not queue:
            return BatchDecision()
        deadlines = np.fromiter((r.deadline_ms for r in queue), float, len(queue))
        apps = [r.app_id for r in queue]
        sizes = [bs for bs in self.table.batch_sizes if bs <= ctx.max_batch] or [self.table.batch_sizes[0]]
        horizon = deadlines - ctx.now_ms - ctx.post_ms
        viable = np.array([self.estimates(apps, bs) <= horizon for bs in sizes])  # Q_bs (lines 10–12)
        timed_out = tuple(np.flatnonzero(~viable.any(0)).tolist())  # lines 13–14
        earliest = [deadlines[row].min() if row.any() else -np.inf for row in viable]
        for j in sorted(range(len(sizes)), key=lambda j: (earliest[j], sizes[j]), reverse=True):  # lines 16–19
            members = np.flatnonzero(viable[j])
            if members.size >= sizes[j]:
                break
        else:
            return BatchDecision(drop=timed_out)
        bs = sizes[j]
        score = self.scores(horizon[members], [apps[i] for i in members], bs)
        order = np.lexsort((deadlines[members], -score))  # highest score first, earlier deadline on ties
        return BatchDecision(run=tuple(members[order[:bs]].tolist()), drop=timed_out)
