"""Ekya micro-profiler: Optimus curve fit, extrapolation and Pareto pruning."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.ekya.thief import RetrainConfig
from gpu.schedulers.ekya.profiler import (AccuracyCurve, ProfileObservation, fit_accuracy_curve, micro_profile,
                                          pareto_front, prune_configs)

TRUE = AccuracyCurve(b0=0.4, b1=2.5, b2=0.08)


def test_fit_recovers_a_known_curve_from_five_epochs():
    epochs = np.arange(1, 6)
    fit = fit_accuracy_curve(epochs, TRUE.predict(epochs), start_accuracy=float(TRUE.predict(0)))
    for k in (5, 15, 30):
        assert fit.predict(k) == pytest.approx(TRUE.predict(k), abs=1e-4)


def test_fit_extrapolates_noisy_points_within_a_few_percent():
    rng = np.random.default_rng(0)
    epochs = np.arange(1, 6)
    noisy = TRUE.predict(epochs) + rng.normal(0, 0.005, epochs.size)
    fit = fit_accuracy_curve(epochs, noisy, start_accuracy=float(TRUE.predict(0)))
    assert abs(fit.predict(30) - TRUE.predict(30)) < 0.03


def test_micro_profile_scales_cost_linearly_in_epochs_and_data():
    obs = ProfileObservation("c", (1, 2, 3, 4, 5), tuple(TRUE.predict(np.arange(1, 6))), 2.0, 0.1, 30, 0.5)
    cfg = micro_profile(obs, start_accuracy=float(TRUE.predict(0)))
    assert cfg.gpu_seconds == pytest.approx(2.0 * 30 * 5)
    assert cfg.accuracy == pytest.approx(TRUE.predict(30), abs=1e-3)


def test_pareto_front_drops_dominated_configs():
    cs = [RetrainConfig("cheap", 0.7, 10), RetrainConfig("dominated", 0.68, 20), RetrainConfig("best", 0.9, 50)]
    assert [c.name for c in pareto_front(cs)] == ["cheap", "best"]


def test_pruning_drops_the_farthest_quarter_and_keeps_the_front():
    cs = [RetrainConfig(f"c{k}", 0.5 + 0.04 * k, 10 + 10 * k) for k in range(6)]
    cs += [RetrainConfig(f"bad{k}", 0.5 + 0.02 * k, 100 + k) for k in range(6)]
    kept = prune_configs(cs)
    assert len(kept) == 9 and {f"c{k}" for k in range(6)} <= {c.name for c in kept}
    assert {"bad0", "bad1", "bad2"}.isdisjoint(c.name for c in kept)


def test_repeated_pruning_shrinks_geometrically_to_the_minimum():
    rng = np.random.default_rng(1)
    cs = [RetrainConfig(f"c{k}", float(rng.uniform(0.5, 0.9)), float(rng.uniform(1, 100))) for k in range(18)]
    sizes = [len(cs)]
    for _ in range(6):
        cs = prune_configs(cs)
        sizes.append(len(cs))
    assert sizes[1] < sizes[0] and sizes[-1] >= 3 and sizes == sorted(sizes, reverse=True)


def test_fit_rejects_too_few_points():
    with pytest.raises(ConfigError, match="accuracies"):
        fit_accuracy_curve([1], [0.5])
