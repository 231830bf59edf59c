"""Utilities and the welfare/fairness metrics of Cilantro (thesis ch. 3, §3.4, eqs. 3.1–3.3 and 3.8).

One implementation shared by the policies, the simulator, the Prefect flow and the tests, so a
"W_S" printed anywhere means the same number.

Utilities are SLO-clipped (Fig. 3.4 of the list of figures / Fig. 3.5 of the body):
``u = min(1, p / SLO) ** k`` with ``k = 1`` (linear), ``2`` (quadratic: small violations are
critical) or ``1/2`` (square root: soft SLOs).

Example:
    >>> social_welfare([1.0, 0.5, 0.2778])  # doctest: +ELLIPSIS
    0.5925...
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpu.errors import ConfigError

UTILITY_EXPONENTS: dict[str, float] = {"linear": 1.0, "quadratic": 2.0, "sqrt": 0.5}


def utility_exponent(shape: str) -> float:
    """Exponent ``k`` of a named utility shape; ConfigError for an unknown one."""
    if shape not in UTILITY_EXPONENTS:
        raise ConfigError("utility", shape, f"unknown; choose one of {sorted(UTILITY_EXPONENTS)}")
    return UTILITY_EXPONENTS[shape]


def utility(perf: np.ndarray | float, slo: float, exponent: float) -> np.ndarray:
    """SLO-clipped utility ``min(1, max(0, p) / slo) ** exponent`` (1 at or above the SLO)."""
    if not slo > 0:
        raise ConfigError("slo", slo, "must be > 0 to define a utility")
    ratio = np.clip(np.asarray(perf, dtype=float) / slo, 0.0, 1.0)
    return ratio**exponent


def social_welfare(utilities: Sequence[float] | np.ndarray) -> float:
    """Eq. (3.1): the mean utility ``(1/n) Σ_j u_j``."""
    return float(np.mean(np.asarray(utilities, dtype=float)))


def egalitarian_welfare(utilities: Sequence[float] | np.ndarray) -> float:
    """Eq. (3.2): the smallest utility ``min_j u_j``."""
    return float(np.min(np.asarray(utilities, dtype=float)))


def njc_fairness(utilities: Sequence[float] | np.ndarray, fair_share_utilities: Sequence[float] | np.ndarray) -> float:
    """Eq. (3.3): ``min_j u_j(a_j) / u_j(R/n)``, clipped to [0, 1].

    A job whose fair-share utility is 0 has no justified complaint (ratio 1) — our choice
    for the 0/0 case the paper leaves open.
    """
    u = np.asarray(utilities, dtype=float)
    fair = np.asarray(fair_share_utilities, dtype=float)
    ratios = np.where(fair > 0, u / np.where(fair > 0, fair, 1.0), 1.0)
    return float(np.clip(ratios.min(), 0.0, 1.0))


def njc_fairness_resource(allocs: Sequence[float] | np.ndarray, demands: Sequence[float] | np.ndarray, capacity: float) -> float:
    """The authors' evaluation-script variant: ``1 − max_j max(0, min(d_j, fs) − a_j)/fs``, ``fs = ⌊R/n⌋``."""
    a = np.asarray(allocs, dtype=float)
    d = np.asarray(demands, dtype=float)
    fs = float(np.floor(capacity / len(a)))
    viol = np.maximum(0.0, np.minimum(d, fs) - a) / fs
    return float(1.0 - viol.max())


def useful_usage(allocs: Sequence[float] | np.ndarray, demands: Sequence[float] | np.ndarray, capacity: float) -> float:
    """Eq. (3.8) normalised by R: ``Σ_j min(a_j, d_j) / R`` (resources that serve a demand)."""
    a = np.asarray(allocs, dtype=float)
    d = np.asarray(demands, dtype=float)
    return float(np.minimum(a, d).sum() / capacity)
