"""Cilantro learners, forecasters and metrics: coverage of the confidence intervals, state round trips."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.demand_mmf import demand_bounds
from gpu.schedulers.cilantro.forecasters import ArimaForecaster, EwmaForecaster
from gpu.schedulers.cilantro.learners import IntervalBinaryTree, SaturatingLearner, learner_from_state
from gpu.schedulers.cilantro.metrics import egalitarian_welfare, njc_fairness, social_welfare, utility
from gpu.schedulers.cilantro.types import JobSpec, JobView


def truth(x):
    return 1 - 1 / (1 + 3 * x)


def fed_tree(seed, points=500, beta=0.2):
    """The tree on binomial(50) reports; ``beta`` 0.2 (not the authors' 1e-3) makes ``β_t`` a noise width."""
    rng = np.random.default_rng(seed)
    tree = IntervalBinaryTree(4.0, lipschitz=3.0, beta=beta, bounds=(0, 1))
    for _ in range(points):
        x = rng.uniform(0, 4)
        tree.update(x, 1.0, rng.binomial(50, truth(x)) / 50, 0.5 / np.sqrt(50))
    return tree


def demand_tree():
    """[0, 4], L = 0.5, σ = 0.1, noise-free y = min(1, x/2) at 64 evenly spaced points, 8 times over."""
    tree = IntervalBinaryTree(4.0, lipschitz=0.5, bounds=(0, 1))
    for _ in range(8):
        for x in np.linspace(0.03125, 3.96875, 64):
            tree.update(x, 1.0, min(1.0, x / 2), 0.1)
    return tree


def test_utility_shapes_and_welfare_metrics_match_the_worked_examples():
    assert [float(utility(0.45, 0.9, k)) for k in (1, 2, 0.5)] == pytest.approx([0.5, 0.25, 0.70711], abs=1e-4)
    assert float(utility(497.1852, 500, 2)) == pytest.approx(0.98877, abs=1e-4)
    assert social_welfare([1, 0.5, 0.2778]) == pytest.approx(0.59259, abs=1e-4)
    assert egalitarian_welfare([1, 0.5, 0.2778]) == pytest.approx(0.2778)
    assert njc_fairness([0.4, 0.4, 0.4], [1, 0.4, 0.2222]) == pytest.approx(0.4)


def test_tree_confidence_intervals_contain_the_true_curve_at_the_90_percent_rate():
    xs = np.linspace(0.01, 4, 200)
    coverage = []
    for seed in range(10):
        lo, hi = fed_tree(seed).confidence(xs)
        coverage.append(np.mean((lo <= truth(xs)) & (truth(xs) <= hi)))
    assert np.mean(coverage) >= 0.9


def test_tree_confidence_intervals_shrink_with_data():
    xs = np.linspace(0.01, 4, 200)
    few, many = fed_tree(0, 50).confidence(xs), fed_tree(0, 2000).confidence(xs)
    assert np.mean(many[1] - many[0]) < 0.5 * np.mean(few[1] - few[0])


def test_beta_t_follows_the_authors_schedule():
    """β_t = 1e-3·√((4 + 2 ln 2)·ln(π²·2^⌈log₂(t+1)⌉/(6δ))), δ = 1e-3: constant on [2^j, 2^(j+1))."""
    tree = IntervalBinaryTree(4.0, lipschitz=1.0)
    for t in (1, 2, 3, 4, 100, 1000):
        doubling = 2 ** math.ceil(math.log2(t + 1))
        expected = 1e-3 * math.sqrt((4 + 2 * math.log(2)) * math.log(math.pi**2 * doubling / 6e-3))
        assert tree.beta_t(t) == pytest.approx(expected, rel=1e-12)
    assert [round(tree.beta_t(t), 8) for t in (1, 2, 3, 4, 100, 1000)] == [
        0.00660465, 0.00688149, 0.00688149, 0.00714762, 0.00812542, 0.00878766]


def test_tree_intervals_after_one_three_and_four_points():
    """[0, 4], L = 1, global bounds ±∞. The root starts split, so a point reaches a depth-1 node whose
    f-interval is f̄ ± (L·4/2 + β_t/√Σw); bounds spread sideways by monotonicity and never loosen."""
    tree = IntervalBinaryTree(4.0, lipschitz=1.0)
    ci = lambda *x: np.array(tree.confidence(np.array(x))).T  # noqa: E731  rows (LCB, UCB)
    tree.update(1.0, 1.0, 0.5, 1.0)
    u = 2 + tree.beta_t(1)  # = 2.006605
    assert ci(0.5, 1.0) == pytest.approx(np.array([[0.5 - u, 0.5 + u]] * 2))
    assert ci(3.0) == pytest.approx(np.array([[0.5 - u, 0.5 + 2 + u]]))  # LCB from the left, UCB from the root (L·4)
    assert ci(1.0) == pytest.approx(np.array([[-1.506605, 2.506605]]), abs=1e-6)
    tree.update(1.0, 1.0, 0.5, 1.0)
    tree.update(1.0, 1.0, 0.5, 1.0)
    u3 = 2 + tree.beta_t(3) / math.sqrt(3)
    assert ci(1.0) == pytest.approx(np.array([[0.5 - u3, 0.5 + u3]]))
    assert ci(1.0) == pytest.approx(np.array([[-1.503973, 2.503973]]), abs=1e-6)
    tree.update(3.0, 1.0, 0.9, 1.0)
    u4 = 2 + tree.beta_t(4)  # β_4 > β_3: the left node's new f-interval is looser and is not taken
    assert ci(3.0, 3.9) == pytest.approx(np.array([[0.9 - u4, 0.9 + u4]] * 2))
    assert ci(3.0) == pytest.approx(np.array([[-1.107148, 2.907148]]), abs=1e-6)
    assert ci(1.0) == pytest.approx(np.array([[-1.503973, 2.503973]]), abs=1e-6)
    assert tree.height == 2
    grid = np.linspace(0, 4, 401)
    lcb, ucb = tree.bounds(grid, 1.0)
    assert demand_bounds(JobView(JobSpec("j", 0.7), grid, lcb, ucb))[0] == 4.0  # ub: no LCB reaches 0.7
    assert grid[np.flatnonzero(ucb >= 0.7)[0]] == 0.0  # lb
    bounded = IntervalBinaryTree(4.0, lipschitz=1.0, bounds=(0, 1))
    bounded.update(1.0, 1.0, 0.5, 1.0)
    assert np.array(bounded.confidence(grid)).T.tolist() == [[0.0, 1.0]] * len(grid)


def test_tree_learns_a_demand_to_within_a_quarter():
    """Goal 0.5, true unit demand 1.0: the authors' estimator gives height 8, CI(1.0) = [0.483946, 0.532107],
    demand bounds [0.9375, 1.0625] (within 0.25), and every CI holds the noise-free truth."""
    tree = demand_tree()
    assert tree.height == 8
    assert np.array(tree.confidence(np.array([1.0]))).ravel() == pytest.approx([0.483946, 0.532107], abs=1e-6)
    grid = np.linspace(0, 4, 4097)  # dyadic: the node edges are grid points
    lcb, ucb = tree.bounds(grid, 1.0)
    d_hat, d_bar = demand_bounds(JobView(JobSpec("j", 0.5), grid, lcb, ucb))
    d_low = grid[np.flatnonzero(ucb >= 0.5)[0]]
    assert (d_low, d_hat) == (0.9375, 1.0625) and d_hat - d_low <= 0.25
    assert 1.0 <= d_bar <= 1.03125  # eq. 3.5's most uncertain point, in the node [1.0, 1.03125]
    assert np.all((lcb <= np.minimum(1, grid / 2)) & (np.minimum(1, grid / 2) <= ucb))


def test_unexplored_tree_is_optimistic():
    lo, hi = IntervalBinaryTree(4.0, bounds=(0, 1)).confidence(np.array([1.0]))
    assert (lo[0], hi[0]) == (0.0, 1.0)


@pytest.mark.parametrize("make", [lambda: fed_tree(3, 300), lambda: SaturatingLearner(1.0, bounds=(0, 1))])
def test_learner_state_round_trips_through_json_and_continues_identically(make):
    learner = make()
    learner.update(1.0, 1.0, 0.6, 0.1)
    restored = learner_from_state(json.loads(json.dumps(learner.get_state())))
    for lr in (learner, restored):
        lr.update(2.0, 1.0, 0.8, 0.1)
    xs = np.linspace(0, 4, 50)
    assert np.array_equal(learner.confidence(xs)[0], restored.confidence(xs)[0])
    assert np.array_equal(learner.confidence(xs)[1], restored.confidence(xs)[1])


def test_arima_ucb_bounds_the_next_loads_and_state_round_trips():
    rng = np.random.default_rng(0)
    series = 100 + np.cumsum(rng.normal(0, 1, 400))
    fc = ArimaForecaster()
    hits = 0
    for t, v in enumerate(series):
        if t > 20:
            hits += fc.forecast(1)[2] >= v
        fc.update(v)
    assert hits / (len(series) - 21) >= 0.85
    twin = ArimaForecaster()
    twin.set_state(json.loads(json.dumps(fc.get_state())))
    assert twin.forecast(12) == fc.forecast(12)
    ew = EwmaForecaster()
    for v in series:
        ew.update(v)
    assert ew.forecast()[2] > ew.forecast()[0]


def test_bad_learner_and_forecaster_settings_are_config_errors():
    with pytest.raises(ConfigError, match="upper"):
        IntervalBinaryTree(0.0)
    with pytest.raises(ConfigError, match="d=2"):
        ArimaForecaster(d=2)
    with pytest.raises(ConfigError, match="learner.kind"):
        learner_from_state({"kind": "gp"})
