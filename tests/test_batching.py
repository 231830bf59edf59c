"""Batch policies (Nexus §6.3 early drop vs lazy drop; spec T9) and the policy protocol."""

import numpy as np
import pytest

from gpu.batching import BatchContext, BatchPolicy, InferenceRequest
from gpu.schedulers.nexus.batching import EarlyDropPolicy, FixedBatchPolicy, LazyDropPolicy
from gpu.systems import make_batch_policy as make_policy
from gpu.errors import ConfigError


def lat(b):
    return b + 10.0


def queue(deadlines):
    return [InferenceRequest(i, "app", 0.0, d) for i, d in enumerate(deadlines)]


T9 = [5, 12, 30, 45, 60, 95]


def test_early_drop_runs_the_full_window_and_drops_the_two_hopeless_requests():
    dec = EarlyDropPolicy().decide(queue(T9), BatchContext(0.0, lat, 4, 64))
    assert dec.run == (2, 3, 4, 5) and dec.drop == (0, 1)


def test_lazy_drop_drops_one_then_runs_a_batch_of_one_for_the_tight_head():
    dec = LazyDropPolicy().decide(queue(T9), BatchContext(0.0, lat, 4, 64))
    assert dec.drop == (0,) and dec.run == (1,)
    rest = queue(T9)[2:]
    dec2 = LazyDropPolicy().decide(rest, BatchContext(11.0, lat, 4, 64))
    assert dec2.run == (0, 1, 2, 3) and dec2.drop == ()


def test_literal_lazy_drop_keeps_requests_not_yet_past_their_deadline():
    dec = LazyDropPolicy(literal=True).decide(queue(T9), BatchContext(0.0, lat, 4, 64))
    assert dec.drop == () and dec.run == (0,)


def test_early_drop_window_shrinks_to_a_short_queue():
    dec = EarlyDropPolicy().decide(queue([100, 100, 100]), BatchContext(0.0, lat, 8, 64))
    assert dec.run == (0, 1, 2)


@pytest.mark.parametrize("seed", range(20))
def test_early_drop_batches_fit_the_target_and_every_run_request_meets_its_deadline(seed):
    rng = np.random.default_rng(seed)
    q = queue(sorted(rng.uniform(0, 120, size=int(rng.integers(1, 60)))))
    target = int(rng.integers(1, 32))
    now = float(rng.uniform(0, 30))
    dec = EarlyDropPolicy().decide(q, BatchContext(now, lat, target, 64))
    assert len(dec.run) <= target
    assert all(q[i].deadline_ms >= now + lat(len(dec.run)) for i in dec.run)
    assert all(q[i].deadline_ms < now + lat(target) for i in dec.drop)
    assert not set(dec.run) & set(dec.drop)


def test_fixed_batch_waits_for_a_full_batch_until_the_head_must_start():
    pol = FixedBatchPolicy()
    wait = pol.decide(queue([100, 101]), BatchContext(0.0, lat, 8, 64))
    assert wait.run == () and wait.wake_at_ms == pytest.approx(100 - lat(8))
    go = pol.decide(queue([100, 101]), BatchContext(95.0, lat, 8, 64))
    assert go.run == (0, 1) and go.drop == ()


def test_every_registered_policy_satisfies_the_protocol():
    for name in ("early_drop", "lazy_drop", "fixed_batch"):
        assert isinstance(make_policy(name), BatchPolicy)
        assert make_policy(name).decide([], BatchContext(0.0, lat, 4, 64)).run == ()


def test_unknown_batch_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="batch_policy='fifo'"):
        make_policy("fifo")


def test_span_api_decides_the_worked_example_over_int64_nanoseconds():
    deadlines = np.array(T9, np.int64) * 1_000_000
    lat_ns = [round(lat(b) * 1e6) for b in range(65)].__getitem__
    assert EarlyDropPolicy().decide_span(deadlines, 0, lat_ns, 4, 64) == (2, 4, None)
    assert LazyDropPolicy().decide_span(deadlines, 0, lat_ns, 4, 64) == (1, 1, None)
    n_drop, n_run, wake = FixedBatchPolicy().decide_span(deadlines[:2] + 95_000_000, 0, lat_ns, 8, 64)
    assert (n_drop, n_run, wake) == (0, 0, 100_000_000 - 18_000_000)


def test_early_drop_window_shrinks_when_the_full_window_part_is_hopeless():
    # ℓ(3) = 13 drops all but the last two; with two left ℓ(2) = 12 still drops one; ℓ(1) = 11 runs the last
    assert EarlyDropPolicy().decide_span(np.array([1.0, 2.0, 11.5, 11.5]), 0.0, lat, 3, 64) == (3, 1, None)
    assert EarlyDropPolicy().decide_span(np.array([1.0, 2.0]), 0.0, lat, 3, 64) == (2, 0, None)
