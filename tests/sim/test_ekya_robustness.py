"""Ekya robustness (thesis §2.4, §2.6, Fig. 2.11b): profiler error, profiling cost, annotation delay."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.ekya_robustness import (annotation_delay, best_uniform, cloud, estimation_error, make_policy, profiling_cost,
                                        run_policy, with_annotation_delay, with_cost_error, with_estimation_error)
from gpu.sim.ekya.run import simulate_policy
from gpu.sim.ekya.workloads import generate


@pytest.fixture(scope="module")
def scenario():
    return generate(8, 4, windows=2, seed=0)


def test_zero_profiler_error_reproduces_the_plain_thief(scenario):
    """With sigma = 0 the thief sees the true profiles and decides exactly as without the wrapper."""
    noiseless = run_policy(scenario, with_estimation_error(scenario, 0.0, np.random.default_rng(0)))
    assert noiseless == pytest.approx(simulate_policy(scenario, "thief").mean_accuracy)


def test_accuracy_degrades_gracefully_with_profiler_error_and_thief_beats_uniform_at_10pct(scenario):
    """More estimation error never helps, and at 10% error (above the measured 5.8%) the thief still wins."""
    out = estimation_error(scenario, trials=2, seed=0)
    curve = [out[f"robust_error_{p}pct_thief_accuracy"] for p in (0, 5, 10, 20)]
    assert all(b <= a + 0.005 for a, b in zip(curve, curve[1:]))
    assert out["robust_error_10pct_thief_accuracy"] > out["robust_error_best_uniform_accuracy"]
    assert 0 < out["robust_error_max_drop"] < 0.15  # graceful: no collapse to no-retraining (~23 points lower)


def test_exhaustive_profiling_erases_the_gain_micro_profiling_keeps(scenario):
    """Profiling every config on all the data (100x micro-profiling's cost) leaves no time to retrain."""
    out = profiling_cost(scenario)
    noretrain = simulate_policy(scenario, "noretrain").mean_accuracy
    assert out["robust_profiling_micro_thief_accuracy"] > out["robust_profiling_best_uniform_accuracy"]
    assert out["robust_profiling_exhaustive_thief_accuracy"] < out["robust_profiling_best_uniform_accuracy"]
    assert out["robust_profiling_exhaustive_thief_accuracy"] == pytest.approx(noretrain, abs=0.01)


def test_annotation_delay_lowers_accuracy_but_the_thief_keeps_its_lead(scenario):
    out = annotation_delay(scenario)
    thief = [out[f"robust_delay_{d}s_thief_accuracy"] for d in (0, 25, 50, 100)]
    uniform = [out[f"robust_delay_{d}s_best_uniform_accuracy"] for d in (0, 25, 50, 100)]
    assert all(b < a for a, b in zip(thief, thief[1:]))
    assert all(t > u for t, u in zip(thief, uniform))


def test_labels_arriving_at_the_window_end_mean_no_retraining(scenario):
    """A delay of a whole window leaves no time to retrain: the thief serves like no retraining."""
    late = with_annotation_delay(make_policy("thief", scenario), scenario.window_s, scenario.window_s)
    assert run_policy(scenario, late) == pytest.approx(simulate_policy(scenario, "noretrain").mean_accuracy, abs=1e-6)
    assert best_uniform(scenario) > run_policy(scenario, late)


def test_cloud_retraining_improves_with_bandwidth_and_plain_cellular_trails_the_edge_thief():
    """Table 2.3: over one 4G subscription the transfers eat the 400 s window; more bandwidth helps."""
    out = cloud(windows=2, seed=0)
    assert out["cloud_cellular_accuracy"] < out["cloud_satellite_accuracy"] < out["cloud_cellular_2x_accuracy"]
    assert out["cloud_cellular_accuracy"] < out["cloud_edge_thief_accuracy"]


def test_cost_errors_up_to_20pct_barely_move_the_thief(scenario):
    """A retraining job takes its true time whatever the profiler said; small cost errors change little."""
    plain = simulate_policy(scenario, "thief").mean_accuracy
    noisy = [run_policy(scenario, with_cost_error(scenario, 0.2, np.random.default_rng(t))) for t in range(3)]
    assert np.mean(noisy) > plain - 0.02
    assert np.mean(noisy) > best_uniform(scenario)
