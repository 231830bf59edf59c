"""Performance learners with confidence intervals (thesis ch. 3, §3.3 "performance learner", §3.6).

Each job's performance is modelled as a non-decreasing function of ``x = a / ℓ`` (resources per
unit load; ``ℓ ≡ 1`` for throughput jobs), learned online from reports ``(alloc, load, reward, σ)``.
Policies consume ``bounds(alloc_grid, load)`` = (LCB, UCB) at a future load.

* :class:`IntervalBinaryTree` — the tree-based binning estimator with a Lipschitz constant
  ([81, 21, 58]; the authors' ``learners/ibtree.py``): a binary tree of intervals on
  ``[0, upper]``; each report is added to every node on its root→leaf path and a leaf with
  ≥ 3 points is split. A node with weighted mean ``f̄`` and weight ``Σw = Σ 1/σ²`` certifies
  ``f̄ ± β/√Σw`` for the mean of ``p`` over its points, hence (monotonicity) ``p(x) ≥ f̄ − β/√Σw``
  right of the node, ``p(x) ≤ f̄ + β/√Σw`` left of it, and (Lipschitz ``L``) the same bounds
  widened by ``L·width`` inside it. The CI at ``x`` is the intersection of all of these, computed
  in closed form with sorted running maxima — the fixed point of the code's bottom-up
  B-interval propagation, recomputed from the data each query.
* :class:`SaturatingLearner` — a simple parametric alternative: weighted Bayesian linear
  regression on ``[1, x/(x+s)]`` with ``β``-scaled posterior bands.

Both serialise to JSON through ``get_state()``/``set_state()``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError


def _valid(alloc: float, load: float, sigma: float) -> bool:
    return alloc > 0 and load > 0 and sigma > 0 and math.isfinite(sigma) and math.isfinite(alloc / load)


def _encode_bounds(lo: float, hi: float) -> list[float | None]:
    """Infinite global bounds become ``null`` so the state is strict JSON."""
    return [lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None]


def _decode_bounds(b: list[float | None]) -> tuple[float, float]:
    return (-math.inf if b[0] is None else float(b[0]), math.inf if b[1] is None else float(b[1]))


class IntervalBinaryTree:
    """Monotone + Lipschitz interval-tree estimator of performance vs resources per unit load.

    Args:
        upper: right end of the learned interval (the profile's ``int_ub``; beyond it the curve is flat).
        lipschitz: ``L`` (per-workload profile value; the text says 10).
        beta: confidence multiplier on ``1/√Σw`` (2.0 gives ≥ 90 % pointwise coverage in our tests).
        bounds: global ``(lo, hi)`` range of performance (e.g. (0, 1) for fractions of queries).
        max_depth: deepest level a leaf may be split to.
    """

    def __init__(self, upper: float, lipschitz: float = 10.0, beta: float = 2.0,
                 bounds: tuple[float, float] = (-math.inf, math.inf), max_depth: int = 14, min_split: int = 3):
        if not upper > 0:
            raise ConfigError("upper", upper, "must be > 0")
        if not lipschitz >= 0:
            raise ConfigError("lipschitz", lipschitz, "must be >= 0")
        if not beta > 0:
            raise ConfigError("beta", beta, "must be > 0")
        self.upper, self.lipschitz, self.beta = float(upper), float(lipschitz), float(beta)
        self.lo, self.hi = float(bounds[0]), float(bounds[1])
        self.max_depth, self.min_split = int(max_depth), int(min_split)
        self._nodes: dict[tuple[int, int], list[float]] = {(0, 0): [0.0, 0.0, 0.0]}  # Σw, Σwy, count
        self._expanded: set[tuple[int, int]] = set()

    @property
    def num_points(self) -> int:
        return int(self._nodes[(0, 0)][2])

    def update(self, alloc: float, load: float, reward: float, sigma: float) -> None:
        """Add one report; reports with a non-positive allocation/load/σ are skipped."""
        if not _valid(alloc, load, sigma) or not math.isfinite(reward):
            return
        x = min(alloc / load, self.upper)
        w = 1.0 / sigma**2
        h, k = 0, 0
        while True:
            node = self._nodes[(h, k)]
            node[0] += w
            node[1] += w * reward
            node[2] += 1
            if (h, k) not in self._expanded:
                break
            mid = (k + 0.5) * self.upper / 2**h
            h, k = h + 1, 2 * k + (1 if x >= mid else 0)
        if node[2] >= self.min_split and h < self.max_depth:
            self._expanded.add((h, k))
            self._nodes[(h + 1, 2 * k)] = [0.0, 0.0, 0.0]
            self._nodes[(h + 1, 2 * k + 1)] = [0.0, 0.0, 0.0]

    def confidence(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(LCB, UCB) of performance at resources-per-unit-load ``x``."""
        x = np.clip(np.asarray(x, dtype=float), 0.0, self.upper)
        keys = [key for key, v in self._nodes.items() if v[2] > 0]
        lcb = np.full(x.shape, self.lo)
        ucb = np.full(x.shape, self.hi)
        if not keys:
            return lcb, ucb
        arr = np.array([[h, k, *self._nodes[(h, k)]] for h, k in keys])
        depth, idx, sw, swy = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
        width = self.upper / 2.0**depth
        start, end = idx * width, (idx + 1) * width
        mean, conf = swy / sw, self.beta / np.sqrt(sw)
        # monotonicity: nodes entirely left of x lower-bound p(x); entirely right upper-bound it
        order = np.argsort(end)
        run_lo = np.maximum.accumulate((mean - conf)[order])
        pos = np.searchsorted(end[order], x, side="right")
        lcb = np.maximum(lcb, np.where(pos > 0, run_lo[np.maximum(pos - 1, 0)], -np.inf))
        order = np.argsort(-start)
        run_hi = np.minimum.accumulate((mean + conf)[order])
        pos = np.searchsorted(-start[order], -x, side="right")
        ucb = np.minimum(ucb, np.where(pos > 0, run_hi[np.maximum(pos - 1, 0)], np.inf))
        # Lipschitz: the node containing x at each depth
        slack = conf + self.lipschitz * width
        for h in np.unique(depth):
            at = depth == h
            w = self.upper / 2.0**h
            cell = np.minimum(np.floor(x / w), 2.0**h - 1)
            key_sorted = np.argsort(idx[at])
            where = np.searchsorted(idx[at][key_sorted], cell)
            where = np.minimum(where, at.sum() - 1)
            hit = idx[at][key_sorted][where] == cell
            m, s = mean[at][key_sorted][where], slack[at][key_sorted][where]
            lcb = np.where(hit, np.maximum(lcb, m - s), lcb)
            ucb = np.where(hit, np.minimum(ucb, m + s), ucb)
        ucb = np.maximum(ucb, lcb)  # noise can make the bounds cross; keep the band ordered
        return np.clip(lcb, self.lo, self.hi), np.clip(ucb, self.lo, self.hi)

    def bounds(self, alloc_grid: np.ndarray, load: float) -> tuple[np.ndarray, np.ndarray]:
        """(LCB, UCB) of performance for each allocation in ``alloc_grid`` at load ``load``."""
        return self.confidence(np.asarray(alloc_grid, dtype=float) / max(load, 1e-12))

    def get_state(self) -> dict[str, Any]:
        return {
            "kind": "ibtree", "upper": self.upper, "lipschitz": self.lipschitz, "beta": self.beta,
            "bounds": _encode_bounds(self.lo, self.hi), "max_depth": self.max_depth, "min_split": self.min_split,
            "nodes": [[h, k, *v] for (h, k), v in sorted(self._nodes.items())],
            "expanded": sorted([list(e) for e in self._expanded]),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["upper"], state["lipschitz"], state["beta"], _decode_bounds(state["bounds"]),
                      state["max_depth"], state["min_split"])
        self._nodes = {(int(n[0]), int(n[1])): [float(v) for v in n[2:]] for n in state["nodes"]}
        self._expanded = {(int(h), int(k)) for h, k in state["expanded"]}


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
