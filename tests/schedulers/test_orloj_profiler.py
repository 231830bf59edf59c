"""ORLOJ's online profiler (thesis §4.3.2): sampling, the sliding window, and learning in the simulator."""

import pytest

from gpu.errors import ConfigError
from gpu.schedulers.orloj.profiler import OnlineProfiler
from gpu.sim.orloj.run import Setup, build_policy, serve
from gpu.sim.orloj.workload import parse


def test_about_one_finished_request_in_ten_is_timed_alone():
    chosen = OnlineProfiler(seed=1).choose(list(range(10_000)))
    assert 900 < len(chosen) < 1100 and len(set(chosen)) == len(chosen)


def test_the_window_forgets_old_measurements_so_a_drift_is_followed():
    prof = OnlineProfiler(window_ms=60_000, min_samples=20)
    for i in range(50):
        prof.record(float(i), "chat", 10.0 + i % 5)
    assert prof.publish(100.0)["chat"].mean == pytest.approx(12.0, abs=0.6)
    for i in range(50):
        prof.record(70_000.0 + i, "chat", 40.0 + i % 5)
    assert prof.publish(70_100.0)["chat"].mean == pytest.approx(42.0, abs=0.6)


def test_an_application_with_too_few_measurements_publishes_nothing():
    prof = OnlineProfiler(min_samples=20)
    for i in range(19):
        prof.record(0.0, "rare", 5.0)
    assert prof.publish(1.0) == {}


@pytest.mark.parametrize("kwargs, field", [({"sample_rate": 0}, "sample_rate"), ({"window_ms": 0}, "window_ms")])
def test_bad_profiler_settings_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        OnlineProfiler(**kwargs)
    assert err.value.field == field


def test_orloj_learning_online_from_a_cold_profile_nearly_matches_a_warm_one():
    raw = {"cases": [{"name": "std-1", "apps": [{"id": "short", "normal": {"mean_ms": 50, "std_ms": 10}},
                                                {"id": "long", "normal": {"mean_ms": 100, "std_ms": 10}}]}],
           "requests": 800, "cost": {"model": "eq43", "overhead_ms": 100}, "orloj": {"profiler": "online", "epoch_s": 5}}
    sc = parse(raw)
    setup = Setup.build(sc.cases[0], sc)
    slo = 3 * setup.p99_ms
    policy = build_policy("orloj", setup, sc, slo)
    cold = policy.table.means[None, 16]
    online = serve(setup, policy, slo, 0, setup.duration_s(sc), profiler=OnlineProfiler(seed=0), epoch_s=5)
    warm = serve(setup, build_policy("orloj", setup, parse({**raw, "orloj": {}}), slo), slo, 0, setup.duration_s(sc))
    assert policy.table.means[None, 16] != cold  # it adopted published histograms
    assert len(online.epochs) == int(setup.duration_s(sc) / 5) and online.epochs[-1].decision.histograms
    assert online.finish_rate == pytest.approx(warm.finish_rate, abs=0.05)
