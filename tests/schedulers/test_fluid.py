"""FLUID (thesis Ch. 3): Algorithm 3.1/3.2 widths, Eq. 3.1/3.2, Theorems 1–2, the executor's placements."""

import math

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import (FluidParams, RunningTrial, Trial, TrialGroup, dynamic_fluid, fit_packing_curve,
                                  load_packing_curve, max_parallelism, packing_curve_path, packing_limit, runtime,
                                  save_packing_curve, static_fluid, theorem1_bound, theorem2_bound)
from gpu.schedulers.fluid.baselines import FifoExecutor
from gpu.schedulers.fluid.controller import FluidExecutor, TrialPlacement, Step
from gpu.sim.fluid.engine import simulate
from gpu.sim.fluid.workload import Workload
from gpu.schedulers.fluid.tuning import FixedTrials

TOY = [("a1", 4.0, {}), ("a2", 4.0, {}), ("a3", 12.0, {}), ("a4", 30.0, {})]


def _toy(policy, executor):
    return simulate(policy, FixedTrials(TOY), executor, Workload(), 5)


def test_toy_example_static_fluid_widths_match_fig_3_5():
    """a4 on three GPUs, a3 on one, a1 and a2 share one GPU (w* = 3.0, 1.2, 0.4, 0.4)."""
    plan = static_fluid([Trial(t, b) for t, b, _ in TOY], 5, FluidParams(c=2, d=5))
    assert plan.widths == (("a4", 3.0), ("a3", 1.0), ("a1", 0.5), ("a2", 0.5))


def test_toy_example_fifo_takes_30s_and_static_fluid_12s():
    fifo = _toy("fifo", FifoExecutor(list(range(5))))
    static = _toy("static", FluidExecutor(list(range(5)), FluidParams(c=2, d=5), dynamic=False))
    assert fifo.makespan_s == pytest.approx(30.0)
    assert static.makespan_s == pytest.approx(12.0)


def test_dynamic_fluid_moves_toy_example_closer_to_the_lower_bound():
    """When a4 finishes at 10 s, a3 (2 s left) scales out to 5 GPUs: 10.4 s, above sum(h)/n = 10 s."""
    result = _toy("fluid", FluidExecutor(list(range(5)), FluidParams(c=2, d=5)))
    assert result.makespan_s == pytest.approx(10.4)
    assert result.resizes == 1


def test_small_trials_get_one_over_c_of_a_gpu():
    plan = static_fluid([Trial("big", 100), Trial("s1", 1), Trial("s2", 1)], 2, FluidParams(c=4, d=2))
    assert plan.width("s1") == plan.width("s2") == 0.25


def test_wide_trials_are_capped_at_d():
    plan = static_fluid([Trial("big", 100), Trial("s", 1)], 8, FluidParams(c=2, d=3))
    assert plan.width("big") == 3.0


def test_width_floor_leaves_a_fraction_unallocated():
    """w* = 1.9 gets one GPU; the rest is left for DynamicFluid (Alg. 3.1's floor)."""
    plan = static_fluid([Trial("a", 19), Trial("b", 21)], 4, FluidParams(c=2, d=4))
    assert plan.width("a") == 1.0 and plan.width("b") == 2.0


def test_runtime_model_eq_3_2():
    assert runtime(10, 0.5, alpha=1.25) == pytest.approx(12.5)  # packed with one other: alpha^(2-1)
    assert runtime(10, 2, beta=1.1) == pytest.approx(5.5)
    assert runtime(10, 1, alpha=2, beta=2) == pytest.approx(10)


def test_dynamic_fluid_scales_up_when_faster_by_more_than_epsilon():
    running = [RunningTrial("a", 10.0, 1.0)]
    assert dynamic_fluid(running, 4, FluidParams(c=2, d=4, epsilon=1.0))[0].new_width == 4.0


def test_dynamic_fluid_keeps_width_when_epsilon_eats_the_gain():
    running = [RunningTrial("a", 2.0, 1.0)]  # 2 s alone vs 0.5 s + 2 s resize
    assert dynamic_fluid(running, 4, FluidParams(c=2, d=4, epsilon=2.0)) == ()


def test_dynamic_fluid_scales_down_when_resource_time_shrinks():
    """On fewer GPUs with beta > 1 the GPU-seconds w * h fall, so the trial gives GPUs back."""
    running = [RunningTrial("a", 40.0, 4.0, beta=1.2)]
    (resize,) = dynamic_fluid(running, 2, FluidParams(c=2, d=4, epsilon=0.5))
    assert resize.new_width == 2.0 and not resize.is_scale_up


def test_dynamic_fluid_does_not_scale_down_without_scaling_overhead():
    running = [RunningTrial("a", 40.0, 4.0, beta=1.0)]
    assert dynamic_fluid(running, 2, FluidParams(c=2, d=4, epsilon=0.5)) == ()


def _random_instance(rng, premise):
    n = int(rng.choice([4, 8, 16]))
    k = int(rng.integers(4, 101))
    c, d = int(rng.integers(1, 5)), int(rng.integers(1, n + 1))
    alpha = float(rng.uniform(1, c / (c - 1))) if premise and c > 1 else 1.0
    beta = float(rng.uniform(1, 1 + 1 / d)) if premise else 1.0
    budgets = rng.lognormal(2, 1, k)
    result = simulate("static", FixedTrials([(f"t{i}", float(b), {}) for i, b in enumerate(budgets)]),
                      FluidExecutor(list(range(n)), FluidParams(c, d), dynamic=False),
                      Workload(alpha=alpha, beta=beta), n)
    return result.makespan_s, [Trial(f"t{i}", float(b), alpha=alpha, beta=beta) for i, b in enumerate(budgets)], n, d


def test_static_fluid_stays_under_theorem_1_bound_on_random_instances():
    rng = np.random.default_rng(1)
    for _ in range(40):
        makespan, trials, n, d = _random_instance(rng, premise=False)
        assert makespan < theorem1_bound(trials, n, d)


def test_static_fluid_stays_under_theorem_2_bound_on_random_instances():
    rng = np.random.default_rng(2)
    for _ in range(40):
        makespan, trials, n, d = _random_instance(rng, premise=True)
        assert makespan < theorem2_bound(trials, n, d)


def test_fit_packing_curve_recovers_alpha_and_c():
    """alpha = 1.25 gives O^4 = 0.0625 > 0.05 and O^5 = 0 (Eq. 3.1), so c = 4."""
    ps = np.arange(1, 9)
    throughputs = ps / (0.1 * 1.25 ** (ps - 1))
    curve = fit_packing_curve(ps, throughputs)
    assert curve.alpha == pytest.approx(1.25, rel=1e-6)
    assert curve.c == 4
    assert curve.marginal_benefit[0] == pytest.approx(0.375)


def test_fit_packing_curve_caps_c_at_the_largest_measured_p():
    curve = fit_packing_curve([1, 2, 3], [1.0, 2.0, 3.0])
    assert curve.alpha == pytest.approx(1.0) and curve.c == 3


def test_a_saved_packing_curve_loads_back_per_device_and_refits(state_dir):
    """The benchmark saves levels + throughputs per device model; loading re-fits alpha and c (Eq. 3.1)."""
    ps = [1, 2, 3, 4, 5]
    curve = fit_packing_curve(ps, [p / (0.1 * 1.25 ** (p - 1)) for p in ps], o_th=0.05)
    assert load_packing_curve("cpu") is None
    path = save_packing_curve(curve, "NVIDIA H100 80GB HBM3", iterations=2000)
    assert path == packing_curve_path("nvidia h100 80gb hbm3") and path.parent == state_dir / "fluid"
    assert load_packing_curve("NVIDIA H100 80GB HBM3") == curve and curve.c == 4
    assert load_packing_curve("cpu") is None  # another device's curve is not used


def test_packing_never_pays_gives_c_1():
    assert packing_limit(2.0) == 1


def test_max_parallelism_from_beta():
    assert max_parallelism(1.0, 8) == 8
    assert max_parallelism(1.25, 8) == 4  # w < beta / (beta - 1) = 5
    assert max_parallelism(2.5, 8) == 1


def test_theorem_bounds_use_the_e_limit_without_overheads():
    trials = [Trial("a", 10)]
    assert theorem2_bound(trials, 1, 1) == pytest.approx(max(2 * 10 + 10 * math.e, 2 * 10 * math.e))


@pytest.mark.parametrize("make, field", [
    (lambda: TrialGroup("g", ()), "trials"),
    (lambda: Trial("t", 0), "budget"),
    (lambda: Trial("t", 1, alpha=0.5), "alpha"),
    (lambda: FluidParams(c=0), "c"),
    (lambda: FluidParams(d=0), "d"),
    (lambda: FluidParams(epsilon=-1), "epsilon"),
    (lambda: fit_packing_curve([2, 3], [1, 1]), "ps"),
    (lambda: fit_packing_curve([1, 2], [1, -1]), "throughputs"),
    (lambda: FluidExecutor([], FluidParams()), "gpus"),
    (lambda: packing_curve_path(" / "), "device"),
])
def test_bad_input_raises_config_error_naming_the_field(make, field):
    with pytest.raises(ConfigError) as err:
        make()
    assert err.value.field == field and field in str(err.value)


def _group(*budgets, gid="g"):
    return TrialGroup(gid, tuple(Trial(f"{gid}{i}", b) for i, b in enumerate(budgets)))


def test_executor_packs_small_trials_c_per_gpu_and_queues_the_rest():
    ex = FluidExecutor([0, 1], FluidParams(c=2, d=2))
    step = ex.on_group(0.0, _group(*[1.0] * 5))
    assert [p.gpus for p in step.starts] == [(0,), (0,), (1,), (1,)]
    assert all(p.width == 0.5 for p in step.starts) and ex.queued == 1


def test_queued_trial_starts_on_the_slot_its_neighbour_frees():
    ex = FluidExecutor([0], FluidParams(c=2, d=1))
    ex.on_group(0.0, _group(3.0, 2.0, 1.0))
    step = ex.on_trial_done(1.0, "g1")
    assert step.starts == (TrialPlacement("g2", 0.5, (0,)),)


def test_rebalance_scales_a_lone_trial_out_onto_freed_gpus():
    ex = FluidExecutor([0, 1, 2, 3], FluidParams(c=2, d=4))
    ex.on_group(0.0, _group(30.0, 10.0))
    ex.on_trial_done(1.0, "g1")
    step = ex.rebalance()
    assert step.resizes == (TrialPlacement("g0", 4.0, (0, 1, 2, 3)),)


def test_static_only_executor_never_resizes():
    ex = FluidExecutor([0, 1, 2, 3], FluidParams(c=2, d=4), dynamic=False)
    ex.on_group(0.0, _group(30.0, 10.0))
    ex.on_trial_done(1.0, "g1")
    assert ex.rebalance() == Step()


def test_removed_gpu_stops_and_requeues_its_trials():
    ex = FluidExecutor([0, 1], FluidParams(c=1, d=1))
    ex.on_group(0.0, _group(5.0, 5.0))
    step = ex.on_resources_changed([0])
    assert step.stops == ("g1",) and ex.queued == 1 and set(ex.running) == {"g0"}


def test_terminating_a_queued_trial_drops_it():
    ex = FluidExecutor([0], FluidParams(c=1, d=1))
    ex.on_group(0.0, _group(5.0, 4.0))
    assert ex.terminate(1.0, "g1") == Step() and ex.queued == 0


def test_fifo_baseline_runs_one_trial_per_gpu_in_submission_order():
    ex = FifoExecutor([0, 1])
    step = ex.on_group(0.0, _group(1.0, 9.0, 5.0))
    assert [(p.trial_id, p.width) for p in step.starts] == [("g0", 1.0), ("g1", 1.0)]
    assert ex.on_trial_done(1.0, "g0").starts == (TrialPlacement("g2", 1.0, (0,)),)


def test_a_resize_of_a_just_started_trial_edits_its_start():
    step = Step(starts=(TrialPlacement("t", 0.5, (0,)),)).then(Step(resizes=(TrialPlacement("t", 2.0, (0, 1)),)))
    assert step == Step(starts=(TrialPlacement("t", 2.0, (0, 1)),))


@pytest.mark.parametrize("policy", ["fifo", "static_fluid", "fluid"])
def test_every_fluid_policy_is_a_contract_controller(policy):
    from gpu.contract import contract_violations
    from gpu.schedulers.fluid.policies import build_executor, policy_names

    ex = build_executor(policy, 2, FluidParams(c=2, d=2))
    assert policy in policy_names() and (ex.system, ex.policy) == ("fluid", policy)
    assert ex.hooks == ("on_group", "on_trial_done") and contract_violations(ex) == []


def test_group_makespan_is_measured_on_the_worlds_clock():
    """The toy group (Fig. 3.5) arrives at 0 and its last trial ends at 10.4 s under Static+DynamicFluid."""
    ex = FluidExecutor(list(range(5)), FluidParams(c=2, d=5))
    result = _toy("fluid", ex)
    assert list(ex.group_makespans.values()) == [pytest.approx(result.makespan_s)] == [10.4]


def test_a_clock_running_backwards_is_refused():
    ex = FluidExecutor([0], FluidParams(c=2, d=1))
    ex.on_group(5.0, _group(3.0, 2.0))
    with pytest.raises(ConfigError) as err:
        ex.on_trial_done(4.0, "g1")
    assert err.value.field == "now"


def test_fit_scaling_recovers_beta_and_a_trial_that_does_not_scale_stays_on_one_gpu():
    from gpu.schedulers.fluid.algorithms import fit_scaling

    widths = [1, 2, 3, 4]
    fit = fit_scaling(widths, [runtime(0.2, w, beta=1.25) for w in widths])
    assert fit.t1 == pytest.approx(0.2) and fit.beta == pytest.approx(1.25)
    assert max_parallelism(fit.beta, 8) == 4
    flat = fit_scaling([1, 2], [0.2, 0.196])  # 2 % faster on two GPUs: noise, not scaling
    assert max_parallelism(flat.beta, 8) == 2 and max_parallelism(flat.beta, 8, min_gain=0.05) == 1


def test_fit_scaling_names_bad_measurements():
    from gpu.schedulers.fluid.algorithms import fit_scaling

    with pytest.raises(ConfigError) as err:
        fit_scaling([2, 3], [0.1, 0.1])
    assert err.value.field == "widths"
    with pytest.raises(ConfigError) as err:
        fit_scaling([1, 2], [0.1, 0.0])
    assert err.value.field == "iter_times"
