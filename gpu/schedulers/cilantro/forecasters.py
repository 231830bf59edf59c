"""Load forecasters: an upper confidence bound on a job's load for the next round (thesis ch. 3, §3.3, §3.6).

The text uses ARMA(1,1) with a 90 % bound; the authors' code fits ARIMA(1,1,1) (statsmodels) on the
last ≤ 4000 load reports and needs ≥ 4 samples. :class:`ArimaForecaster` does both orders
(``d = 1`` default, ``d = 0`` = the text's ARMA) with the closed-form Hannan–Rissanen estimator —
a long autoregression for the innovations, then one least-squares fit of ``(c, φ, θ)`` — so a
refit costs microseconds instead of a numerical likelihood search. The bound covers the whole
next round: the max over its ``horizon`` report steps of ``mean_k + z·sd_k``. :class:`EwmaForecaster`
is a cheap fallback for loads without structure.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
from scipy.stats import norm

from gpu.errors import ConfigError


class ArimaForecaster:
    """ARIMA(1, d, 1) load forecaster with a two-sided ``confidence`` prediction band.

    Args:
        d: differencing order, 1 (authors' code) or 0 (the text's ARMA(1,1)).
        confidence: level of the band (0.9); the UCB is its upper end.
        window: most recent observations used for the fit (code: 4000).
    """

    def __init__(self, d: int = 1, confidence: float = 0.9, window: int = 4000):
        if d not in (0, 1):
            raise ConfigError("d", d, "must be 0 (ARMA) or 1 (ARIMA)")
        if not 0 < confidence < 1:
            raise ConfigError("confidence", confidence, "must be in (0, 1)")
        if window < 8:
            raise ConfigError("window", window, "must be >= 8")
        self.d, self.confidence, self.window = d, confidence, window
        self.history: list[float] = []

    def update(self, load: float) -> None:
        if math.isfinite(load):
            self.history.append(float(load))
            del self.history[: -self.window]

    def forecast(self, horizon: int = 1) -> tuple[float, float, float]:
        """``(mean, lcb, ucb)`` of the load over the next ``horizon`` steps (UCB = worst step)."""
        y = np.asarray(self.history)
        if len(y) < 4:
            last = float(y[-1]) if len(y) else 1.0
            return last, last, last
        z_conf = float(norm.ppf(0.5 + self.confidence / 2))
        z = np.diff(y) if self.d == 1 else y
        try:
            c, phi, theta, resid, sigma = _hannan_rissanen(z)
        except np.linalg.LinAlgError:
            m, s = float(y.mean()), float(y.std())
            return m, m - 2 * 0.9 * s, m + 2 * 0.9 * s  # the code's fallback on a failed fit
        steps = np.empty(horizon)
        prev, e = z[-1], resid[-1]
        for k in range(horizon):
            prev = c + phi * prev + (theta * e if k == 0 else 0.0)
            steps[k] = prev
        psi = np.concatenate([[1.0], (phi + theta) * phi ** np.arange(horizon - 1)])
        if self.d == 1:
            means = y[-1] + np.cumsum(steps)
            var = sigma**2 * np.cumsum(np.cumsum(psi) ** 2)
        else:
            means = steps
            var = sigma**2 * np.cumsum(psi**2)
        sd = np.sqrt(var)
        return float(means.mean()), float((means - z_conf * sd).min()), float((means + z_conf * sd).max())

    def get_state(self) -> dict[str, Any]:
        return {"kind": "arima", "d": self.d, "confidence": self.confidence, "window": self.window,
                "history": list(self.history)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["d"], state["confidence"], state["window"])
        self.history = [float(v) for v in state["history"]]


def _hannan_rissanen(z: np.ndarray) -> tuple[float, float, float, np.ndarray, float]:
    """Fit ``z_t = c + φ z_{t−1} + θ e_{t−1} + e_t``; returns ``(c, φ, θ, residuals, σ)``."""
    m = int(min(10, max(1, len(z) // 4)))
    if len(z) < m + 4:  # too short for the two-stage fit: white noise around the mean
        resid = z - z.mean()
        return float(z.mean()), 0.0, 0.0, resid, float(resid.std() + 1e-9)
    lags = np.column_stack([np.ones(len(z) - m)] + [z[m - i - 1: len(z) - i - 1] for i in range(m)])
    coef, *_ = np.linalg.lstsq(lags, z[m:], rcond=None)
    e = np.concatenate([np.zeros(m), z[m:] - lags @ coef])
    x = np.column_stack([np.ones(len(z) - m - 1), z[m:-1], e[m:-1]])
    (c, phi, theta), *_ = np.linalg.lstsq(x, z[m + 1:], rcond=None)
    phi, theta = float(np.clip(phi, -0.99, 0.99)), float(np.clip(theta, -0.99, 0.99))
    resid = z[m + 1:] - x @ np.array([c, phi, theta])
    return float(c), phi, theta, np.concatenate([e[: m + 1], resid]), float(resid.std() + 1e-9)


class EwmaForecaster:
    """Exponentially weighted mean and variance; UCB = mean + z·sd (no trend, no lag structure)."""

    def __init__(self, alpha: float = 0.1, confidence: float = 0.9):
        if not 0 < alpha <= 1:
            raise ConfigError("alpha", alpha, "must be in (0, 1]")
        self.alpha, self.confidence = alpha, confidence
        self.mean: float | None = None
        self.var = 0.0

    def update(self, load: float) -> None:
        if self.mean is None:
            self.mean = float(load)
            return
        delta = load - self.mean
        self.mean += self.alpha * delta
        self.var = (1 - self.alpha) * (self.var + self.alpha * delta**2)

    def forecast(self, horizon: int = 1) -> tuple[float, float, float]:
        m = 1.0 if self.mean is None else self.mean
        half = float(norm.ppf(0.5 + self.confidence / 2)) * math.sqrt(self.var)
        return m, m - half, m + half

    def get_state(self) -> dict[str, Any]:
        return {"kind": "ewma", "alpha": self.alpha, "confidence": self.confidence, "mean": self.mean, "var": self.var}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["alpha"], state["confidence"])
        self.mean, self.var = state["mean"], float(state["var"])
