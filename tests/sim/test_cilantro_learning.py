"""Cilantro learning and robustness (thesis §3.5, §3.7, Figs. 3.9-3.11, 3.13): the shapes the paper reports."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cilantro_learning import (ToldPolicy, ci_noise, environment, fallback, learning, misreporting,
                                          noise_sensitivity, per_job, run)
from gpu.schedulers.cilantro.policies import make_policy


@pytest.fixture(scope="module")
def cfg():
    return environment(3600.0)


def test_told_policy_with_the_truth_decides_exactly_like_the_plain_policy(cfg):
    """The harness itself changes nothing: an identity rewrite reproduces the plain run."""
    plain = run(cfg, make_policy("cilantro-njc"), 0)
    told = run(cfg, ToldPolicy(make_policy("cilantro-njc"), lambda _, v: v, "cilantro-njc"), 0)
    assert np.array_equal(plain.rounds["social_welfare"], told.rounds["social_welfare"])


def test_confidence_intervals_shrink_as_the_learner_sees_data(cfg):
    out = learning(cfg, 0)
    assert out["learn_ci_width_last_round"] < 0.5 * out["learn_ci_width_first_round"]
    assert out["learn_with_ci_njc_fairness"] > 0.95


def test_njc_leaves_no_job_much_below_its_fair_share_while_social_welfare_does(cfg):
    """Fig. 3.10: Cilantro-NJC users are at most marginally worse off than under Resource-Fair."""
    out = per_job(cfg, 0)
    assert out["fig3_10_cilantro_njc_worst_shortfall"] < 0.03
    assert out["fig3_10_cilantro_sw_worst_shortfall"] > out["fig3_10_cilantro_njc_worst_shortfall"]


def test_over_reporting_gains_nothing_under_njc(cfg):
    """Fig. 3.11: under Cilantro-NJC a user's true utility does not rise when it inflates its reports."""
    out = misreporting(cfg, 0, ("cilantro-njc",))
    assert out["fig3_11_cilantro_njc_over_report_ratio"] <= 1.0 + 1e-9


def test_under_stated_demands_collapse_njc_fairness_while_welfare_drops_gracefully(cfg):
    """Fig. 3.13-center: F_NJC is small when fallback users state half their demand; welfare degrades mildly."""
    out = fallback(cfg, 0)
    assert out["fallback_half_demand_njc_fairness"] < out["fallback_feedback_njc_fairness"] - 0.2
    assert out["fallback_half_demand_social_welfare"] > out["fallback_feedback_social_welfare"] - 0.15
    assert out["fallback_twice_demand_social_welfare"] > out["fallback_feedback_social_welfare"] - 0.03


def test_welfare_declines_gracefully_with_ci_noise():
    """Fig. 3.13-right: up to 20% noise on every bound costs little; 50% costs more."""
    out = noise_sensitivity(environment(3600.0, synthetic=True), 0)
    clean = out["ci_noise_0pct_social_welfare"]
    assert all(out[f"ci_noise_{p}pct_social_welfare"] > clean - 0.03 for p in (5, 10, 20))
    assert out["ci_noise_50pct_social_welfare"] < clean


def test_ci_noise_keeps_every_lower_bound_below_its_upper_bound(cfg):
    told = ToldPolicy(make_policy("cilantro-njc"), ci_noise(0.5, np.random.default_rng(0)), "noisy")
    run(cfg, told, 0)
    assert all(np.all(v.perf_lcb <= v.perf_ucb) for snap in told.seen for v in snap.jobs)
