"""Performance learners with confidence intervals (thesis ch. 3, §3.3 "performance learner", §3.6).

Each job's performance is modelled as a non-decreasing function of ``x = a / ℓ`` (resources per
unit load; ``ℓ ≡ 1`` for throughput jobs), learned online from reports ``(alloc, load, reward, σ)``.
Policies consume ``bounds(alloc_grid, load)`` = (LCB, UCB) at a future load.

* :class:`IntervalBinaryTree` — the tree-based binning estimator with a Lipschitz constant
  ([81, 21, 58]), as the authors' ``learners/ibtree.py`` computes it: a binary tree of intervals on
  ``[0, upper]`` whose nodes carry confidence intervals that only ever tighten.
* :class:`SaturatingLearner` — a simple parametric alternative: weighted Bayesian linear
  regression on ``[1, x/(x+s)]`` with ``β``-scaled posterior bands.

Both serialise to JSON through ``get_state()``/``set_state()``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError

_TAU = 1e-5  # coefficient of the data mass τ(h, t) a node needs before points descend below it
_SPLIT_POINTS = 3  # points a leaf needs before it is split
_MAX_HEIGHT = 52  # float resolution: x cannot tell apart nodes narrower than 2^-52 of the interval


def _valid(alloc: float, load: float, sigma: float) -> bool:
    return alloc > 0 and load > 0 and sigma > 0 and math.isfinite(sigma) and math.isfinite(alloc / load)


def _encode_bounds(lo: float, hi: float) -> list[float | None]:
    """Infinite global bounds become ``null`` so the state is strict JSON."""
    return [lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None]


def _decode_bounds(b: list[float | None]) -> tuple[float, float]:
    return (-math.inf if b[0] is None else float(b[0]), math.inf if b[1] is None else float(b[1]))


class IntervalBinaryTree:
    """Monotone + Lipschitz interval-tree estimator of performance vs resources per unit load.

    Thesis §3.6 ("a tree-based binning estimator [81, 21, 58] with Lipschitz constant ... for each job's
    resource-to-performance estimation"), ported from the authors' ``learners/ibtree.py`` so its numbers
    carry over. Node ``(h, k)`` covers the ``k``-th of ``2^h`` equal parts of ``[0, upper]``; each keeps the
    weights ``w = 1/σ²`` and weighted mean ``f̄`` of the reports routed through it and the *f-interval*
    ``f̄ ± (L·upper/2^h + β_t/√Σw)``, a bound on ``p`` over the node (Lipschitz ``L`` for the node's width,
    ``β_t`` for the noise). Its *B-interval* ``[B_lb, B_ub]`` bounds ``p`` at the node's left and right ends:
    the f-interval intersected with what the children and, by monotonicity, the nodes beside it at the same
    depth imply; B-intervals only ever tighten, so a later, larger ``β_t`` never loosens them.

    * ``β_t = beta · √((4 + 2 ln 2) · ln(π² · 2^⌈log₂(t+1)⌉ / (6δ)))`` with ``t`` the points in the tree
      (the authors' ``beta = 1e-3``, ``δ = 1e-3``: ``β_t ≈ 0.0066–0.0088`` for t = 1…1000).
    * A point descends below a node only while the node holds data mass ``Σw ≥ τ(h, t) =
      1e-5 · (β_t/L)² · 4^h``; the leaf it stops at is split once it holds 3 points and that mass.
    * The root starts split; B-intervals of the path are updated on every point, those of the whole tree
      (bottom-up, monotone sweeps per depth) whenever ``t`` is a power of two.
    * ``CI(x)``: the tightest B-bounds on the root→leaf path of ``x``, intersected with the bounds the
      nodes at the depths below that leaf imply for its unexpanded children.

    Args:
        upper: right end of the learned interval (the profile's ``int_ub``; beyond it the curve is flat).
        lipschitz: ``L`` (the authors' per-workload profile value; the text says 10). Must be > 0.
        beta: coefficient of ``β_t`` (the authors' 1e-3).
        bounds: global ``(lo, hi)`` range of performance (e.g. (0, 1) for fractions of queries).
        delta: ``δ`` of ``β_t``.
    """

    def __init__(self, upper: float, lipschitz: float = 10.0, beta: float = 1e-3,
                 bounds: tuple[float, float] = (-math.inf, math.inf), delta: float = 1e-3):
        if not upper > 0 or not math.isfinite(upper):
            raise ConfigError("upper", upper, "must be a finite number > 0")
        if not lipschitz > 0 or not math.isfinite(lipschitz):
            raise ConfigError("lipschitz", lipschitz, "must be a finite number > 0")
        if not beta > 0:
            raise ConfigError("beta", beta, "must be > 0")
        if not 0 < delta < 1:
            raise ConfigError("delta", delta, "must be in (0, 1)")
        self.upper, self.lipschitz, self.beta, self.delta = float(upper), float(lipschitz), float(beta), float(delta)
        self.lo, self.hi = float(bounds[0]), float(bounds[1])
        self.num_points = 0
        # (h, k) -> [Σw, Σwy, points, B_lb, B_ub]
        self._nodes: dict[tuple[int, int], list[float]] = {(0, 0): [0.0, 0.0, 0, self.lo, self.hi]}
        self._rows: dict[int, list[int]] = {0: [0]}  # depth -> sorted k of the nodes there
        self._split(0, 0)

    def beta_t(self, t: int) -> float:
        """Noise multiplier ``β_t`` after ``t`` points (doubling schedule: constant for t in [2^j, 2^(j+1)))."""
        doubling = 1 << t.bit_length()  # 2^⌈log₂(t+1)⌉
        return self.beta * math.sqrt((4 + 2 * math.log(2)) * math.log(math.pi**2 * doubling / (6 * self.delta)))

    def _tau(self, h: int) -> float:
        return _TAU * (self.beta_t(self.num_points) / self.lipschitz) ** 2 * 4.0**h

    def _mid(self, h: int, k):
        """Midpoint of node (h, k); ``k`` may be an array (the query descends with the same arithmetic)."""
        return (k + 0.5) * self.upper / 2.0**h

    def _inner(self, h: int, k: int) -> bool:
        return (h + 1, 2 * k) in self._nodes

    def _f(self, h: int, k: int) -> tuple[float, float]:
        sw, swy = self._nodes[(h, k)][:2]
        if sw <= 0:
            return self.lo, self.hi
        u = self.lipschitz * self.upper / 2.0**h + self.beta_t(self.num_points) / math.sqrt(sw)
        return swy / sw - u, swy / sw + u

    def _beside(self, h: int, k: int) -> tuple[float, float]:
        """(B_lb of the nearest node left of position ``k`` at depth ``h``, B_ub of the nearest right of it)."""
        row = self._rows.get(h, [])
        i = bisect_right(row, k)
        return (self._nodes[(h, row[i - 1])][3] if i else self.lo,
                self._nodes[(h, row[i])][4] if i < len(row) else self.hi)

    def _below(self, h: int, k: int) -> tuple[float, float]:
        """Bounds on ``p`` over the absent node (h, k) from the nodes beside its left descendants at every depth."""
        lo, hi = self.lo, self.hi
        while h in self._rows:
            a, b = self._beside(h, k)
            lo, hi = max(lo, a), min(hi, b)
            h, k = h + 1, 2 * k
        return lo, hi

    def _split(self, h: int, k: int) -> None:
        """Create the children of (h, k); they start from the B-bounds of their neighbours at that depth."""
        lo, hi = self._beside(h + 1, 2 * k)
        row = self._rows.setdefault(h + 1, [])
        i = bisect_right(row, 2 * k)
        row[i:i] = [2 * k, 2 * k + 1]
        self._nodes[(h + 1, 2 * k)] = [0.0, 0.0, 0, lo, hi]
        self._nodes[(h + 1, 2 * k + 1)] = [0.0, 0.0, 0, lo, hi]

    def _implied(self, h: int, k: int) -> tuple[float, float]:
        """What (h, k)'s children imply for its ends: left child's B_lb and right child's B_ub, or for a leaf
        the bounds of its unexpanded children."""
        if self._inner(h, k):
            return self._nodes[(h + 1, 2 * k)][3], self._nodes[(h + 1, 2 * k + 1)][4]
        return self._below(h + 1, 2 * k)

    def _tighten(self, h: int, k: int) -> None:
        """B-interval of (h, k) ∩ its f-interval ∩ its children's; then lift B_lb of the nodes right of it
        and lower B_ub of those left of it (monotonicity), stopping where they are already tighter."""
        node, (flo, fhi), (clo, chi) = self._nodes[(h, k)], self._f(h, k), self._implied(h, k)
        node[3], node[4] = max(flo, node[3], clo), min(fhi, node[4], chi)
        row = self._rows[h]
        i = bisect_right(row, k)
        for j in row[i:]:
            other = self._nodes[(h, j)]
            if other[3] >= node[3]:
                break
            other[3] = node[3]
        for j in reversed(row[:i - 1]):
            other = self._nodes[(h, j)]
            if other[4] <= node[4]:
                break
            other[4] = node[4]

    def _sweep(self) -> None:
        """Recompute every B-interval bottom-up; per depth B_lb non-decreasing and B_ub non-increasing in k."""
        for h in sorted(self._rows, reverse=True):
            row = [(k, self._nodes[(h, k)], self._f(h, k), self._implied(h, k)) for k in self._rows[h]]
            run = self.lo
            for _, node, (flo, _), (clo, _) in row:
                run = max(run, flo, node[3], clo)
                node[3] = run
            run = self.hi
            for _, node, (_, fhi), (_, chi) in reversed(row):
                run = min(run, fhi, node[4], chi)
                node[4] = run

    def update(self, alloc: float, load: float, reward: float, sigma: float) -> None:
        """Add one report at ``x = alloc/load``; reports with a non-positive allocation/load/σ are skipped."""
        if not _valid(alloc, load, sigma) or not math.isfinite(reward):
            return
        x, w = min(alloc / load, self.upper), 1.0 / sigma**2
        self.num_points += 1
        h, k = 0, 0
        path = [(0, 0)]
        while True:
            node = self._nodes[(h, k)]
            node[0] += w
            node[1] += w * reward
            node[2] += 1
            if not self._inner(h, k) or node[0] < self._tau(h):
                break
            h, k = h + 1, 2 * k + (x >= self._mid(h, k))
            path.append((h, k))
        for hk in reversed(path):
            self._tighten(*hk)
        if not self._inner(h, k) and node[2] >= _SPLIT_POINTS and node[0] >= self._tau(h) and h < _MAX_HEIGHT:
            self._split(h, k)
        if self.num_points & (self.num_points - 1) == 0:
            self._sweep()

    @property
    def height(self) -> int:
        """Depth of the deepest nodes."""
        return max(self._rows)

    def confidence(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(LCB, UCB) of performance at resources-per-unit-load ``x`` (clipped to the global bounds; a band
        whose bounds cross is closed at its LCB so policies get an ordered band)."""
        x = np.clip(np.asarray(x, dtype=float), 0.0, self.upper)
        lcb, ucb = np.full(x.shape, self.lo), np.full(x.shape, self.hi)
        k = np.zeros(x.shape, dtype=np.int64)
        on_path = np.ones(x.shape, dtype=bool)  # False: below the leaf of x, following its left descendants
        for h in sorted(self._rows):
            row = self._rows[h]
            blb = np.array([self._nodes[(h, j)][3] for j in row])
            bub = np.array([self._nodes[(h, j)][4] for j in row])
            inner = np.array([self._inner(h, j) for j in row])
            i = np.searchsorted(row, k, side="right")  # on the path the node itself is row[i - 1]
            lcb = np.maximum(lcb, np.where(i > 0, blb[np.maximum(i - 1, 0)], self.lo))
            right = np.where(on_path, i - 1, i)
            ucb = np.minimum(ucb, np.where(right < len(row), bub[np.minimum(right, len(row) - 1)], self.hi))
            on_path &= inner[np.maximum(i - 1, 0)]
            k = 2 * k + (on_path & (x >= self._mid(h, k)))
        lcb = np.clip(lcb, self.lo, self.hi)
        return lcb, np.maximum(np.clip(ucb, self.lo, self.hi), lcb)

    def bounds(self, alloc_grid: np.ndarray, load: float) -> tuple[np.ndarray, np.ndarray]:
        """(LCB, UCB) of performance for each allocation in ``alloc_grid`` at load ``load``."""
        return self.confidence(np.asarray(alloc_grid, dtype=float) / max(load, 1e-12))

    def get_state(self) -> dict[str, Any]:
        return {
            "kind": "ibtree", "upper": self.upper, "lipschitz": self.lipschitz, "beta": self.beta, "delta": self.delta,
            "bounds": _encode_bounds(self.lo, self.hi), "num_points": self.num_points,
            "nodes": [[h, k, sw, swy, n, *_encode_bounds(blb, bub)]
                      for (h, k), (sw, swy, n, blb, bub) in sorted(self._nodes.items())],
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["upper"], state["lipschitz"], state["beta"], _decode_bounds(state["bounds"]),
                      state["delta"])
        self.num_points = int(state["num_points"])
        self._nodes = {(int(h), int(k)): [float(sw), float(swy), int(n), *_decode_bounds([blb, bub])]
                       for h, k, sw, swy, n, blb, bub in state["nodes"]}
        self._rows = {}
        for h, k in sorted(self._nodes):
            self._rows.setdefault(h, []).append(k)


class SaturatingLearner:
    """Parametric learner: ``p(x) ≈ θ0 + θ1 · x/(x + s)``, weighted Bayesian linear regression.

    Cheap and data-efficient when the curve is concave and saturating; biased otherwise (use the
    tree then). ``bounds`` are ``mean ± β · posterior std``, made non-decreasing.
    """

    def __init__(self, scale: float, beta: float = 2.0, prior_std: float = 1e3,
                 bounds: tuple[float, float] = (-math.inf, math.inf)):
        if not scale > 0:
            raise ConfigError("scale", scale, "must be > 0")
        self.scale, self.beta, self.prior_std = float(scale), float(beta), float(prior_std)
        self.lo, self.hi = float(bounds[0]), float(bounds[1])
        self._precision = np.eye(2) / self.prior_std**2
        self._b = np.zeros(2)

    def _features(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return np.stack([np.ones_like(x), x / (x + self.scale)], axis=-1)

    def update(self, alloc: float, load: float, reward: float, sigma: float) -> None:
        if not _valid(alloc, load, sigma) or not math.isfinite(reward):
            return
        phi = self._features(np.array(alloc / load))
        self._precision += np.outer(phi, phi) / sigma**2
        self._b += phi * reward / sigma**2

    def confidence(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cov = np.linalg.inv(self._precision)
        phi = self._features(np.clip(x, 0.0, None))
        mean = phi @ (cov @ self._b)
        std = np.sqrt(np.einsum("...i,ij,...j->...", phi, cov, phi))
        lcb = np.maximum.accumulate(np.clip(mean - self.beta * std, self.lo, self.hi))
        ucb = np.maximum.accumulate(np.clip(mean + self.beta * std, self.lo, self.hi))
        return lcb, np.maximum(ucb, lcb)

    def bounds(self, alloc_grid: np.ndarray, load: float) -> tuple[np.ndarray, np.ndarray]:
        return self.confidence(np.asarray(alloc_grid, dtype=float) / max(load, 1e-12))

    def get_state(self) -> dict[str, Any]:
        return {"kind": "saturating", "scale": self.scale, "beta": self.beta, "prior_std": self.prior_std,
                "bounds": _encode_bounds(self.lo, self.hi), "precision": self._precision.tolist(), "b": self._b.tolist()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["scale"], state["beta"], state["prior_std"], _decode_bounds(state["bounds"]))
        self._precision = np.array(state["precision"], dtype=float)
        self._b = np.array(state["b"], dtype=float)


def learner_from_state(state: Mapping[str, Any]) -> IntervalBinaryTree | SaturatingLearner:
    """Rebuild a learner of either kind from ``get_state()`` output (what a resumed flow calls)."""
    kinds = {"ibtree": IntervalBinaryTree, "saturating": SaturatingLearner}
    if state.get("kind") not in kinds:
        raise ConfigError("learner.kind", state.get("kind"), f"unknown; choose one of {sorted(kinds)}")
    learner = kinds[state["kind"]].__new__(kinds[state["kind"]])
    learner.set_state(state)
    return learner
