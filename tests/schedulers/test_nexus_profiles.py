"""Batching profiles (Nexus §6.1 Eq. 1): the published data, the linear fit, profiles from measurements."""

import pytest

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Session, SquishyPacker
from gpu.schedulers.nexus.profiles import (CODE, PAPER, fit_linear, load_published_profile, profile_from_measurements,
                                           published_profiles, table_profile)
from gpu.schedulers.nexus.synthetic import synthetic_profile


@pytest.mark.parametrize("model,rows,pre_us,post_us", [("vgg16", 174, 3306.44, 1.4025), ("vgg_face", 173, 3165.01, 2.3435),
                                                      ("vgg_s", 512, 3280.8, 1.2005), ("yolo9000", 24, 9480.56, 47495.1)])
def test_published_profiles_are_contiguous_from_batch_1(model, rows, pre_us, post_us):
    p = load_published_profile(model)
    assert p.batches == tuple(range(1, rows + 1))
    assert all(isinstance(m, int) for m in p.memory_bytes)
    assert p.pre_ms > pre_us / 1000 and p.post_ms > post_us / 1000  # mean + std


def test_linear_fit_of_vgg16_up_to_batch_64_matches_the_spec():
    fit = fit_linear(published_profiles()["vgg16"], 64)
    assert (fit.alpha_ms, fit.beta_ms) == pytest.approx((3.3723, 1.9444), rel=1e-3)
    assert fit.r2 > 0.99


def test_max_batch_of_vgg16_under_both_presets():
    p = published_profiles()["vgg16"]
    assert [PAPER.max_batch(p, slo) for slo in (50, 100, 200, 300, 400, 500)] == [6, 14, 29, 44, 58, 72]
    assert [CODE.max_batch(p, slo) for slo in (50, 100, 200, 300, 400, 500)] == [5, 13, 28, 42, 55, 70]


def test_profile_from_measurements_averages_repeats_and_fills_gaps_from_the_line():
    samples = [(1, 5.0), (1, 7.0), (4, 12.0), (8, 20.0)]
    p = profile_from_measurements("mine", samples)
    assert p.batches == tuple(range(1, 9))
    assert p.latency(1) == pytest.approx(6.0) and p.std(1) > 0
    assert p.latency(4) == pytest.approx(12.0)
    assert p.latency(4) < p.latency(6) < p.latency(8)


def test_unknown_published_model_is_a_config_error():
    with pytest.raises(ConfigError, match="model='resnet'"):
        load_published_profile("resnet")


def test_bad_measurements_are_a_config_error():
    with pytest.raises(ConfigError, match="samples"):
        profile_from_measurements("mine", [(0, 5.0)])


@pytest.mark.parametrize("model,lat1,gain", [("resnet50", 6.2, 8.0), ("inception", 7.0, 8.0), ("ssd", 47.0, 4.7)])
def test_synthetic_profiles_hit_the_paper_anchors(model, lat1, gain):
    p = synthetic_profile(model)
    assert p.latency(1) == pytest.approx(lat1)
    assert (32 / p.latency(32)) / (1 / p.latency(1)) == pytest.approx(gain)
    assert p.memory(1) > 0


def test_unknown_synthetic_model_is_a_config_error():
    with pytest.raises(ConfigError, match="model='alexnet'"):
        synthetic_profile("alexnet")


def test_a_batch_whose_latency_equals_the_budget_up_to_rounding_is_accepted():
    """ℓ(2) = 0.1 + 0.2 = 0.30000000000000004 ms against 2ℓ(b) ≤ L = 0.6 ms: equal in exact arithmetic."""
    p = table_profile("m", {1: 0.1, 2: 0.1 + 0.2, 3: 0.5})
    assert p.latency(2) > 0.6 / 2  # the float sum rounds up
    assert PAPER.max_batch(p, 0.6) == 2
    b, duty = PAPER.residual(p, 0.6, rate=2000 / 0.3, cap=2)  # b/r + ℓ(b) = 0.3 + 0.3 = L
    assert (b, duty) == (2, pytest.approx(0.3))
    plan = SquishyPacker({"m": p}).plan([Session("s", "m", 0.6, 20000.0)])
    assert {pl.batch for n in plan.nodes for pl in n.placements} == {2} and not plan.violations()
