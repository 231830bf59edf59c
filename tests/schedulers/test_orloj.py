"""ORLOJ engine (thesis Ch. 4): batch-latency distributions, the priority score, Algorithm 4.1."""

from itertools import combinations
from math import factorial

import numpy as np
import pytest

from gpu.batching import BatchContext, InferenceRequest
from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.errors import ConfigError
from gpu.schedulers.orloj.policy import (Histogram, OrlojPolicy, RESET_EXPONENT, batch_latency, line_coefficients,
                                  max_cdf, priority_scores, step_cost_scores)

TWO_APPS = {"short": Histogram([10, 20], [1]), "long": Histogram([40, 60], [1])}


def ctx(now=0.0, max_batch=16):
    return BatchContext(now, lambda b: float(b), 1, max_batch)


def test_batch_of_a_short_and_a_long_request_runs_as_two_long_ones():
    """Eq. 4.3/4.4: padded to the longest, ``c0 + k·(max a − c0)``."""
    assert PaddedBatchModel(5.0).batch_ms([12.0, 50.0]) == 5.0 + 2 * 45.0


def test_expected_batch_latency_worked_example():
    """U[10,20] and U[40,60] alone times, c0 = 5: E[L_B(1)] is the mixture mean, E[L_B(2)] = 5 + 2·(50 − 5)."""
    policy = OrlojPolicy(TWO_APPS, PaddedBatchModel(5.0))
    assert policy.table.means[None, 1] == pytest.approx(32.5)
    assert policy.table.means[None, 2] == pytest.approx(95.0)
    means = [policy.table.means[None, bs] for bs in policy.table.batch_sizes]
    assert means == sorted(means)


def _eq_4_8(fs, Fs):
    """Özbey et al.'s PDF of the max of independent, non-identical variables (thesis Eq. 4.7/4.8)."""
    k = len(fs)
    total = 0.0
    for kappa in range(1, k + 1):
        inner = 0.0
        for s in combinations(range(k), kappa):
            F_s = sum(Fs[i] for i in s) / kappa
            f_s = sum(fs[i] for i in s) / kappa
            inner += k * F_s ** (k - 1) * f_s
        total += (-1) ** (k - kappa) * kappa ** k / factorial(k) * inner
    return total


def test_eq_4_8_equals_the_derivative_of_the_product_of_cdfs():
    rng = np.random.default_rng(0)
    hists = [Histogram.from_samples(rng.normal(mu, 4, 5000).clip(1), bins=30) for mu in (20, 30, 45)]
    x = np.linspace(15, 55, 41)
    h = 1e-4
    derivative = (max_cdf(hists, x + h) - max_cdf(hists, x - h)) / (2 * h)
    # Eq. 4.8 with the histograms' own piecewise-constant densities, checked away from bin edges
    fs = [hh.density[np.clip(np.searchsorted(hh.edges, x) - 1, 0, hh.masses.size - 1)]
          * ((x > hh.edges[0]) & (x < hh.edges[-1])) for hh in hists]
    eq48 = _eq_4_8(fs, [hh.cdf(x) for hh in hists])
    on_edge = np.zeros_like(x, bool)
    for hh in hists:
        on_edge |= np.min(np.abs(x[:, None] - hh.edges[None, :]), axis=1) < 2 * h
    assert np.allclose(derivative[~on_edge], eq48[~on_edge], rtol=1e-6, atol=1e-9)


def test_eq_4_2_matches_a_monte_carlo_of_eq_4_1():
    """p(t) = (1/E[L])·(E[C(t+τ+L)] − E[C(t+L)]) with a unit step cost at D and τ ~ Exp(b)."""
    rng = np.random.default_rng(1)
    lat = Histogram([10, 20, 35, 50], [0.5, 0.2, 0.3])
    b, n = 0.05, 2_000_000
    L = lat.sample(rng, n)
    tau = rng.exponential(1 / b, n)
    for slack in (5.0, 15.0, 30.0, 60.0, 200.0):
        miss_delayed = (L + tau > slack).mean()
        miss_now = (L > slack).mean()
        mc = (miss_delayed - miss_now) / lat.mean
        exact = priority_scores(np.array([slack]), lat, lat.mean, b)[0]
        assert exact == pytest.approx(mc, abs=4e-4 / lat.mean + 1e-6)


def test_multi_step_cost_is_the_sum_of_single_steps_appendix_c2():
    """Cost 1 after D, 3 after D + 20: Eq. 4.2 per step equals a Monte-Carlo of Eq. 4.1 on the whole step."""
    rng = np.random.default_rng(2)
    lat = Histogram([5, 15, 30], [0.6, 0.4])
    b, n = 0.04, 2_000_000
    L, tau = lat.sample(rng, n), rng.exponential(1 / b, n)

    def cost(finish_after_now, slack):
        late = finish_after_now - slack
        return np.where(late > 20, 3.0, np.where(late > 0, 1.0, 0.0))

    for slack in (8.0, 25.0, 45.0):
        mc = (cost(L + tau, slack).mean() - cost(L, slack).mean()) / lat.mean
        exact = step_cost_scores(np.array([slack]), lat, lat.mean, b, [(0.0, 1.0), (20.0, 3.0)])[0]
        assert exact == pytest.approx(mc, abs=5e-3 / lat.mean)  # ~4 standard errors


def test_fig_4_6_toy_batch_latency_is_shifted_right_and_above_the_common_mean():
    """Type 1 concentrated at l = 10, type 2 either very early or very late (same mean); bs = 2, c0 = 0."""
    steady = Histogram([9.5, 10.5], [1])
    erratic = Histogram([1, 2, 18, 19], [0.5, 0, 0.5])
    assert steady.mean == pytest.approx(erratic.mean)
    lb = batch_latency([[steady, erratic], [erratic, steady]], PaddedBatchModel(0.0), points=2000)
    per_request = Histogram(lb.edges / 2, lb.masses)  # c1·k = 1: the max itself
    assert per_request.mean > 10.0
    assert per_request.cdf(9.45) == 0.0  # the short type never sets the batch's time
    mixture = Histogram.mixture([steady, erratic])
    x = np.linspace(0, 20, 201)
    assert np.all(per_request.cdf(x) <= mixture.cdf(x) + 1e-12)  # every quantile moved right of a request's


def test_score_rises_toward_the_deadline_then_drops_to_zero_for_a_hopeless_request():
    lat = Histogram([10, 20], [1])
    s = priority_scores(np.array([500.0, 100.0, 25.0, 15.0, 9.0]), lat, lat.mean, 1e-2)
    assert s[0] < s[1] < s[2] and s[3] < s[2] and s[4] == 0.0


def test_line_form_equals_the_direct_score_and_keeps_its_order_across_a_base_time_reset():
    rng = np.random.default_rng(3)
    lat = Histogram.from_samples(rng.gamma(4, 10, 3000), bins=50)
    b = 1e-3
    deadlines = rng.uniform(0, 400, 30) + 1000.0
    t = 1000.0
    direct = priority_scores(deadlines - t, lat, lat.mean, b)
    for base in (0.0, 900.0):  # before and after resetting the base time to 900 ms
        alpha, beta, milestone = line_coefficients(deadlines - base, t - base, lat, lat.mean, b)
        assert np.allclose(alpha * np.exp(b * (t - base)) + beta, direct, rtol=1e-9, atol=1e-12)
        assert np.all(milestone > t - base)
        assert list(np.argsort(-(alpha * np.exp(b * (t - base)) + beta), kind="stable")) == \
            list(np.argsort(-direct, kind="stable"))
    assert RESET_EXPONENT * 7 < 709  # a reset well before float64 overflows


def test_scores_stay_finite_far_from_the_base_time():
    lat = Histogram([10, 20], [1])
    s = priority_scores(np.array([1e9, 1e12]), lat, lat.mean, 0.1)
    assert np.all(np.isfinite(s)) and np.all(s >= 0)


def _random_queue(rng, n, now):
    apps = list(TWO_APPS)
    return [InferenceRequest(i, apps[rng.integers(2)], now - 5, now + float(rng.uniform(-10, 600))) for i in range(n)]


def test_algorithm_4_1_invariants_on_random_queues():
    """Nested viable queues; the chosen bs fits its queue; a timed-out request never runs; positions unique."""
    rng = np.random.default_rng(4)
    policy = OrlojPolicy(TWO_APPS, PaddedBatchModel(5.0))
    for trial in range(200):
        now = float(rng.uniform(0, 1e5))
        queue = _random_queue(rng, int(rng.integers(0, 40)), now)
        snapshot = list(queue)
        dec = policy.decide(queue, ctx(now))
        assert queue == snapshot
        assert not set(dec.run) & set(dec.drop) and len(set(dec.run)) == len(dec.run)
        viable = {bs: {i for i, r in enumerate(queue) if now + policy.table.means[None, bs] <= r.deadline_ms}
                  for bs in policy.table.batch_sizes}
        sizes = policy.table.batch_sizes
        assert all(viable[a] >= viable[b] for a, b in zip(sizes, sizes[1:]))
        assert set(dec.drop) == set(range(len(queue))) - viable[1]
        if dec.run:
            bs = len(dec.run)
            assert bs in sizes and set(dec.run) <= viable[bs] and len(viable[bs]) >= bs
            assert not any(len(viable[s]) >= s for s in sizes if s > bs)  # the largest feasible size
        else:
            assert not viable[1]


def test_the_most_urgent_feasible_requests_win_the_batch():
    """Of 3 queued, a batch of 2 takes the two closest to their deadline that can still make it."""
    policy = OrlojPolicy({"a": Histogram([10, 20], [1])}, PaddedBatchModel(2.0), batch_sizes=(1, 2))
    queue = [InferenceRequest(0, "a", 0, 1000.0), InferenceRequest(1, "a", 0, 60.0), InferenceRequest(2, "a", 0, 45.0)]
    dec = policy.decide(queue, BatchContext(0.0, float, 1, 2))
    assert sorted(dec.run) == [1, 2] and dec.drop == ()


def test_new_histograms_change_the_batch_size():
    policy = OrlojPolicy({"a": Histogram([10, 20], [1])}, batch_sizes=(1, 2, 4))
    queue = [InferenceRequest(i, "a", 0, 70.0) for i in range(4)]
    assert len(policy.decide(queue, ctx()).run) == 2  # E[L_B(4)] = 4·E[max of 4] = 72 > 70
    policy.update_histograms({"a": Histogram([5, 10], [1])})
    assert len(policy.decide(queue, ctx()).run) == 4


def test_an_application_without_a_histogram_uses_the_model_wide_one():
    policy = OrlojPolicy(TWO_APPS, mix="request_aware")
    assert policy.estimates(["unknown"], 1)[0] == pytest.approx(32.5)
    assert policy.estimates(["short", "long"], 1).tolist() == pytest.approx([15.0, 50.0])


@pytest.mark.parametrize("kwargs, field", [
    (dict(model=PaddedBatchModel(60.0)), "c0"),
    (dict(b=0.0), "b"),
    (dict(mix="nearest"), "mix"),
    (dict(batch_sizes=(0, 2)), "batch_sizes"),
    (dict(cost_steps=((0.0, 2.0), (5.0, 1.0))), "cost_steps"),
])
def test_bad_configuration_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        OrlojPolicy(TWO_APPS, **kwargs)
    assert err.value.field == field


def test_bad_histograms_and_overheads_name_the_field():
    with pytest.raises(ConfigError) as err:
        OrlojPolicy({})
    assert err.value.field == "histograms"
    with pytest.raises(ConfigError) as err:
        Histogram.from_samples([])
    assert err.value.field == "histogram"
    with pytest.raises(ConfigError) as err:
        PaddedBatchModel(-1.0)
    assert err.value.field == "c0"


def test_own_app_batches_are_priced_from_their_own_application_only():
    """Per-session queues (the Nexus runtime): two U[40,60] requests, E[max] = 40 + 20·2/3."""
    policy = OrlojPolicy(TWO_APPS, PaddedBatchModel(5.0), mix="own_app")
    assert policy.estimates(["long"], 2)[0] == pytest.approx(5 + 2 * (40 + 40 / 3 - 5), rel=1e-3)
    assert policy.estimates(["short"], 1)[0] == pytest.approx(15.0)


def test_a_measured_profile_replaces_eq_4_3s_linear_growth():
    """ℓ(k) = 1 + 0.5·√k ms measured with c0 = 1: a batch of 4 costs 2× a batch of one's work, not 4×."""
    model = PaddedBatchModel.from_profile(lambda k: 1.0 + 0.5 * k ** 0.5, 16, c0=1.0)
    assert model.factor(1) == 1.0 and model.factor(4) == pytest.approx(2.0) and model.factor(16) == pytest.approx(4.0)
    assert model.batch_ms([1.5, 3.0]) == pytest.approx(1.0 + 2 ** 0.5 * 2.0)
    assert PaddedBatchModel(1.0).factor(4) == 4.0  # Eq. 4.3 by default
    policy = OrlojPolicy({"a": Histogram([10, 20], [1])}, PaddedBatchModel(1.0, (1.0, 1.5, 1.8, 2.0)),
                         batch_sizes=(1, 4))
    assert policy.table.means[None, 4] == pytest.approx(1.0 + 2.0 * (18.0 - 1.0), rel=1e-3)  # E[max of 4] = 18
    with pytest.raises(ConfigError) as err:
        PaddedBatchModel(1.0, (2.0, 3.0))
    assert err.value.field == "growth"
