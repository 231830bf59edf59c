"""Ekya's micro-profiler: predict each retraining config's accuracy and cost from a short trial.

Paper: Ekya thesis Chapter 2, §2.4 "Micro-profiler". Each config is
trained on a small data sample (10%) for a few epochs (5); the accuracy-vs-epoch points are fitted
to the Optimus curve ``acc(k) = 1 - (1/(b0*k + b1) + b2)`` with b >= 0 (scipy ``curve_fit``,
anchored at (0 epochs, current accuracy)) and extrapolated to the config's full epoch count.
As the paper's code does, the per-epoch curve on the sample stands in for the full-data curve.
GPU cost is rescaled linearly in epochs and data size. Configs far from the accuracy/cost Pareto
front are pruned (a fixed fraction every 2 windows; we drop the worst 25%, keeping at least 3).

Example::

    >>> obs = ProfileObservation("cfg", (1, 2, 3, 4, 5), (0.62, 0.68, 0.71, 0.73, 0.74), 2.0, 0.1, 30, 1.0)
    >>> round(micro_profile(obs, start_accuracy=0.5).accuracy, 2), micro_profile(obs).gpu_seconds
    (0.8, 600.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import curve_fit

from gpu.errors import ConfigError
from gpu.schedulers.ekya.thief import RetrainConfig


def optimus_accuracy(k: np.ndarray | float, b0: float, b1: float, b2: float) -> np.ndarray | float:
    """Accuracy after ``k`` epochs in Optimus form: 1 - (1/(b0*k + b1) + b2)."""
    return 1.0 - (1.0 / (b0 * np.asarray(k, dtype=float) + b1) + b2)


@dataclass(frozen=True)
class AccuracyCurve:
    """A fitted Optimus curve; ``predict(epochs)`` extrapolates it."""

    b0: float
    b1: float
    b2: float

    def predict(self, epochs: float | np.ndarray) -> np.ndarray | float:
        return np.clip(optimus_accuracy(epochs, self.b0, self.b1, self.b2), 0.0, 1.0)


def fit_accuracy_curve(epochs: Sequence[float], accuracies: Sequence[float],
                       start_accuracy: float | None = None) -> AccuracyCurve:
    """Fit ``acc(k)`` to observed (epoch, accuracy) points, optionally anchored at (0, start_accuracy)."""
    k = np.asarray(epochs, dtype=float)
    a = np.asarray(accuracies, dtype=float)
    if k.shape != a.shape or k.size < 2:
        raise ConfigError("accuracies", list(accuracies), "need at least two points, one per epoch")
    if np.any(k <= 0) or np.any((a < 0) | (a > 1)):
        raise ConfigError("accuracies", list(accuracies), "epochs must be > 0 and accuracies in [0, 1]")
    if start_accuracy is not None:
        k, a = np.concatenate(([0.0], k)), np.concatenate(([start_accuracy], a))
    # Start from a curve through the first and last points with b2 = 1 - max accuracy (no headroom assumed).
    b2_0 = max(0.0, 1.0 - a.max() - 0.05)
    b1_0 = 1.0 / max(1e-3, 1.0 - a[0] - b2_0)
    b0_0 = max(1e-3, (1.0 / max(1e-3, 1.0 - a[-1] - b2_0) - b1_0) / max(k[-1], 1.0))
    (b0, b1, b2), _ = curve_fit(optimus_accuracy, k, a, p0=(b0_0, max(b1_0, 1.0), b2_0),
                                bounds=([0.0, 1.0, 0.0], [np.inf, np.inf, 1.0]), maxfev=20000)
    return AccuracyCurve(float(b0), float(b1), float(b2))


@dataclass(frozen=True)
class ProfileObservation:
    """What micro-profiling one config produced: per-epoch validation accuracy on a data sample.

    ``seconds_per_epoch`` is measured at 100% of one GPU on ``profiled_fraction`` of the window's
    training data; ``epochs_target`` and ``data_fraction`` describe the real config.
    """

    config: str
    epochs: tuple[float, ...]
    accuracies: tuple[float, ...]
    seconds_per_epoch: float
    profiled_fraction: float
    epochs_target: float
    data_fraction: float

    def __post_init__(self) -> None:
        for name in ("seconds_per_epoch", "profiled_fraction", "epochs_target", "data_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
                raise ConfigError(f"{self.config}.{name}", v, "must be a finite number > 0")


def profiled_gpu_seconds(obs: ProfileObservation) -> float:
    """The config's full-data GPU-seconds: the profiled epoch cost rescaled linearly in epochs and data."""
    return obs.seconds_per_epoch * obs.epochs_target * (obs.data_fraction / obs.profiled_fraction)


def micro_profile(obs: ProfileObservation, start_accuracy: float | None = None) -> RetrainConfig:
    """Predicted ``RetrainConfig`` (accuracy at ``epochs_target``, full-data GPU-seconds) for one config."""
    curve = fit_accuracy_curve(obs.epochs, obs.accuracies, start_accuracy)
    return RetrainConfig(obs.config, float(curve.predict(obs.epochs_target)), profiled_gpu_seconds(obs))


def pareto_front(configs: Sequence[RetrainConfig]) -> tuple[RetrainConfig, ...]:
    """Configs no other config beats on both accuracy (higher) and GPU cost (lower)."""
    return tuple(c for c in configs if not any(
        o.accuracy >= c.accuracy and o.gpu_seconds <= c.gpu_seconds
        and (o.accuracy > c.accuracy or o.gpu_seconds < c.gpu_seconds) for o in configs))


def distance_to_front(config: RetrainConfig, front: Sequence[RetrainConfig]) -> float:
    """Accuracy lost against the best front config that costs no more (0 for front members)."""
    cheaper = [f.accuracy for f in front if f.gpu_seconds <= config.gpu_seconds]
    return max(0.0, max(cheaper, default=config.accuracy) - config.accuracy)


def prune_configs(configs: Sequence[RetrainConfig], fraction: float = 0.25, keep_min: int = 3) -> tuple[RetrainConfig, ...]:
    """Drop the ``fraction`` of configs farthest from the Pareto front (never front members, keep >= ``keep_min``).

    The paper prunes "after every 2 windows", so the config list shrinks geometrically; the caller
    decides when (e.g. ``window % 2 == 1``). Order of the survivors is preserved.
    """
    if not 0 <= fraction < 1:
        raise ConfigError("fraction", fraction, "must be in [0, 1)")
    front = pareto_front(configs)
    n_drop = min(int(math.floor(len(configs) * fraction)), max(0, len(configs) - keep_min))
    off_front = sorted((c for c in configs if c not in front), key=lambda c: -distance_to_front(c, front))
    dropped = {c.name for c in off_front[:n_drop]}
    return tuple(c for c in configs if c.name not in dropped)
