"""Thief scheduler (Ekya Algorithms 1-2): the paper's Table 2.1 example and invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.ekya.thief import (EkyaParams, InferenceProfile, RetrainConfig, StreamState, estimate_accuracy,
                                 fair_allocation, infer_job, pick_configs, thief_schedule, train_job)
from gpu.schedulers.ekya.baselines import fixed_config_schedule, fixed_res_schedule, uniform_schedule
from gpu.schedulers.ekya.placement import to_gpu_requests
from gpu.sim.ekya.workloads import generate

TOY = EkyaParams(delta=0.1, a_min=0.40)


def _table_2_1_window_1() -> list[StreamState]:
    return [StreamState("A", 0.65, (RetrainConfig("cfg1", 0.75, 85), RetrainConfig("cfg2", 0.70, 65))),
            StreamState("B", 0.50, (RetrainConfig("cfg1", 0.90, 80), RetrainConfig("cfg2", 0.85, 50)))]


def _random_streams(seed: int, n: int, gpus: float) -> list[StreamState]:
    sc = generate(n, gpus, windows=1, seed=seed)
    return [StreamState(s.name, s.windows[0].start_accuracy, s.windows[0].configs, s.inference) for s in sc.streams]


def test_thief_prioritises_stream_b_in_window_1_with_cfg2b():
    d = thief_schedule(_table_2_1_window_1(), gpus=3, window_s=120, params=TOY)
    assert d.stream("B").config == "cfg2"
    assert d.stream("B").retrain_gpus > d.stream("A").retrain_gpus


def test_uniform_drops_inference_below_a_min_as_in_fig_2_4():
    d = uniform_schedule(_table_2_1_window_1(), 3, 120, "cfg1", 0.5, TOY)
    assert d.stream("A").min_accuracy == pytest.approx(0.4875)  # "65% -> 49%"
    assert d.stream("B").min_accuracy == pytest.approx(0.375)  # "50% -> 37.5%"


def test_thief_keeps_table_2_1_inference_above_a_min():
    d = thief_schedule(_table_2_1_window_1(), gpus=3, window_s=120, params=TOY)
    assert all(s.min_accuracy >= 0.40 for s in d.streams)


def test_estimate_accuracy_is_the_piecewise_time_average():
    a = _table_2_1_window_1()[0]
    est = estimate_accuracy(a, a.configs[1], infer_gpus=0.5, retrain_gpus=0.5, window_s=120, params=TOY)
    # 65 GPU-s at 0.5 GPU = 130 s > 120 s: infeasible, old model at half rate the whole window.
    assert est.retrain_s == pytest.approx(130) and est.expected_accuracy == pytest.approx(0.325)
    est = estimate_accuracy(a, a.configs[1], infer_gpus=0.5, retrain_gpus=1.0, window_s=120, params=TOY)
    assert est.expected_accuracy == pytest.approx((65 * 0.65 * 0.5 + 55 * 0.70 * 1.0) / 120)


def test_a_min_shortfall_is_penalised_not_dropped():
    b = _table_2_1_window_1()[1]
    est = estimate_accuracy(b, None, infer_gpus=0.7, retrain_gpus=0.0, window_s=120, params=TOY)
    assert est.score == pytest.approx(0.35 - 10 * (0.40 - 0.35))


def test_a_model_already_below_a_min_is_not_penalised_for_its_frame_rate():
    """No inference config can lift such a model to a_MIN, so its GPUs should go to retraining."""
    weak = StreamState("W", 0.25, (RetrainConfig("cfg", 0.80, 40),))
    d = estimate_accuracy(weak, weak.configs[0], infer_gpus=0.5, retrain_gpus=0.5, window_s=120, params=TOY)
    assert d.min_accuracy < TOY.a_min and d.score == pytest.approx(d.expected_accuracy)
    fast = thief_schedule([weak], gpus=1.0, window_s=120, params=TOY)
    assert fast.stream("W").config == "cfg" and fast.stream("W").retrain_gpus >= 0.5


def test_thief_stops_stealing_when_accuracy_stops_improving():
    streams = _table_2_1_window_1()
    d = thief_schedule(streams, 3, 120, TOY)
    again = thief_schedule(streams, 3, 120, TOY, start=d.allocation())
    assert again.score == pytest.approx(d.score)
    assert again.pick_calls < d.pick_calls


@pytest.mark.parametrize("seed", range(6))
def test_thief_allocations_stay_in_the_pool_and_on_the_delta_grid(seed):
    rng = np.random.default_rng(seed)
    gpus, delta, n = int(rng.integers(1, 5)), float(rng.choice([0.1, 0.2, 0.5])), int(rng.integers(1, 7))
    streams = _random_streams(seed, n, gpus)
    params = EkyaParams(delta=delta)
    d = thief_schedule(streams, gpus, 200, params)
    alloc = d.allocation()
    assert sum(alloc.values()) <= gpus + 1e-9
    assert all(0 <= g <= 1.0 + 1e-9 for g in alloc.values())
    for job, g in alloc.items():
        steps = (g - d.start[job]) / delta
        assert abs(steps - round(steps)) < 1e-6


@pytest.mark.parametrize("seed", range(6))
def test_thief_is_never_worse_than_its_fair_start(seed):
    streams = _random_streams(seed, 1 + seed, gpus=2)
    d = thief_schedule(streams, 2, 200, EkyaParams(a_min=0.3))
    fair = fair_allocation(2 * len(streams), 2, 1.0)
    start = {job: fair for s in streams for job in (infer_job(s.name), train_job(s.name))}
    assert d.score >= pick_configs(streams, start, 2, 200, EkyaParams(a_min=0.3)).score - 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_thief_respects_a_min_when_it_is_feasible(seed):
    streams = _random_streams(seed, 4, gpus=2)
    # Every stream keeps >= 0.9 of its accuracy at 0.125 GPU, so a_MIN = 0.3 fits easily in 2 GPUs.
    d = thief_schedule(streams, 2, 200, EkyaParams(a_min=0.3))
    assert all(s.min_accuracy >= 0.3 - 1e-9 for s in d.streams)


def test_same_seed_gives_the_same_decision():
    a = thief_schedule(_random_streams(7, 5, 2), 2, 200)
    b = thief_schedule(_random_streams(7, 5, 2), 2, 200)
    assert a == b


def test_fixed_config_ablation_only_uses_the_fixed_config():
    d = fixed_config_schedule(_random_streams(1, 4, 2), 2, 200, "cfg2")
    assert {s.config for s in d.streams} <= {"cfg2", None}


def test_fixed_res_ablation_keeps_the_uniform_partition():
    d = fixed_res_schedule(_random_streams(1, 4, 2), 2, 200)
    assert all(s.infer_gpus == pytest.approx(0.25) for s in d.streams)


def test_gpu_requests_never_exceed_the_pool_or_a_device():
    reqs = to_gpu_requests({"a": 0.35, "b": 0.35, "c": 0.3}, 2)
    assert sum(r.gpus for r in reqs) <= 2
    per_device: dict[int, float] = {}
    for r in reqs:
        for dev in r.devices:
            per_device[dev] = per_device.get(dev, 0.0) + (r.gpus if r.gpus < 1 else 1.0)
    assert all(v <= 1 + 1e-9 for v in per_device.values())
    assert [r.gpus for r in reqs] == [0.7, 0.7, 0.3]


def test_gpu_requests_of_a_gpu_or_more_are_whole_devices():
    reqs = {r.job: r for r in to_gpu_requests({"big": 0.55, "small": 0.2}, 4)}
    assert reqs["big"].gpus == 2.0 and len(reqs["big"].devices) == 2
    assert reqs["small"].gpus == pytest.approx(0.8) and len(reqs["small"].devices) == 1


@pytest.mark.parametrize("kwargs, field", [
    ({"gpus": -1}, "gpus"), ({"window_s": 0}, "window_s"), ({"params": None}, "delta")])
def test_bad_scheduler_input_names_the_field(kwargs, field):
    args = {"streams": _table_2_1_window_1(), "gpus": 3, "window_s": 120, "params": TOY}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=field):
        if args["params"] is None:
            args["params"] = EkyaParams(delta=-0.1)
        thief_schedule(**args)


def test_config_without_accuracy_is_rejected():
    with pytest.raises(ConfigError, match="accuracy"):
        RetrainConfig("cfg1", math.nan, 10)


def test_default_thief_is_algorithm_1_step_by_step():
    """Two inference-only streams, 1 GPU, Delta = 0.1; relative accuracy 3x up to 0.2 GPU, then 0.6 + 0.5(x - 0.2).

    Line 2: fair start 0.5/0.5, score (0.9*0.75 + 0.6*0.75)/2 = 0.5625. Thief A robs B while it pays:
    (0.6, 0.4) 0.57, (0.7, 0.3) 0.5775, (0.8, 0.2) 0.585, (0.9, 0.1) 0.5175 -> stop at (0.8, 0.2). Thief B
    from (0.8, 0.2): (0.7, 0.3) 0.5775 -> stop. The second pass improves nothing.
    """
    inference = InferenceProfile(1.0, ((0.0, 0.0), (0.2, 0.6), (1.0, 1.0)))
    streams = [StreamState("A", 0.9, inference=inference), StreamState("B", 0.6, inference=inference)]
    d = thief_schedule(streams, gpus=1.0, window_s=100)
    assert d.start == {"A/infer": 0.5, "B/infer": 0.5}
    assert d.allocation() == pytest.approx({"A/infer": 0.8, "B/infer": 0.2})
    assert d.score == pytest.approx(0.585)


def test_start_splits_is_an_option_by_name_and_changes_the_start():
    """One stream: acc 0.5, config 0.9 for 50 GPU-s, 100-s window, Delta = 0.5 (coarse).

    Algorithm 1: fair 0.5/0.5 retrains in exactly 100 s (0.25), inference takes all: 0.5 -> 1 GPU to inference.
    With start splits the best start is 0.9 inference / 0.1 idle training (0.45); a step of 0.5 cannot leave it.
    """
    stream = [StreamState("A", 0.5, (RetrainConfig("cfg", 0.9, 50.0),))]
    alg1 = thief_schedule(stream, 1.0, 100, EkyaParams(delta=0.5))
    assert alg1.start == {"A/infer": 0.5, "A/train": 0.5}
    assert alg1.allocation() == pytest.approx({"A/infer": 1.0}) and alg1.score == pytest.approx(0.5)
    splits = thief_schedule(stream, 1.0, 100, EkyaParams(delta=0.5, start_splits=True))
    assert splits.start == pytest.approx({"A/infer": 0.9, "A/train": 0.1})
    assert splits.allocation() == pytest.approx({"A/infer": 0.9}) and splits.score == pytest.approx(0.45)
    assert EkyaParams().start_splits is False
