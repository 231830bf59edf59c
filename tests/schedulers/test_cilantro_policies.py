"""Cilantro policies: the Fig. 3.4 example, each policy's defining property, registry invariants, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.policies import POLICIES, make_policy
from gpu.schedulers.cilantro.types import Feedback, JobSpec, JobView, Snapshot
from gpu.schedulers.cilantro.demand_mmf import demand_bounds, recommend_demand
from gpu.schedulers.cilantro.fair import max_min_fair
from gpu.schedulers.cilantro.greedy import GreedyEW
from gpu.schedulers.cilantro.minerva import minerva_shares
from gpu.sim.cilantro.scenario import static_example


def linear_jobs(demands, capacity, feedback=None):
    grid = np.arange(int(capacity) + 1, dtype=float)
    return tuple(
        JobView(JobSpec(f"j{i}", 1.0), grid, np.minimum(1, grid / d), np.minimum(1, grid / d), 1.0,
                None if feedback is None else feedback[i], demand_cap=d)
        for i, d in enumerate(demands)
    )


FIG34 = {  # policy: (allocation, W_S, W_E, F_NJC, useful/R)
    "resource-fair": ("20/20/20", 0.5407, 0.2222, 1.0, 0.8333),
    "oracle-njc": ("10/25/25", 0.5926, 0.2778, 1.0, 1.0),
    "oracle-sw": ("10/50/0", 0.6667, 0.0, 0.0, 1.0),
    "oracle-ew": ("4/20/36", 0.4, 0.4, 0.4, 1.0),
}


@pytest.mark.parametrize("policy", sorted(FIG34))
def test_fig34_three_job_example_matches_the_paper_for_each_criterion(policy):
    row = static_example(60, [10, 50, 90], [policy])[0]
    alloc, ws, we, f, useful = FIG34[policy]
    assert row["allocation"] == alloc
    assert row["social_welfare"] == pytest.approx(ws, abs=1e-4)
    assert row["egalitarian_welfare"] == pytest.approx(we, abs=1e-4)
    assert row["njc_fairness"] == pytest.approx(f, abs=1e-4)
    assert row["useful_usage"] == pytest.approx(useful, abs=1e-4)


def test_water_filling_matches_the_worked_examples():
    assert max_min_fair([5, 20, 40, 80], 100) == pytest.approx([5, 20, 37.5, 37.5])
    assert max_min_fair([5, 20, 30, 80], 100) == pytest.approx([5, 20, 30, 45])
    assert max_min_fair([80, 10, 60], 100, [2, 1, 1]) == pytest.approx([60, 10, 30])
    assert max_min_fair([np.inf] * 4, 100) == pytest.approx([25] * 4)


def test_max_min_fair_no_job_can_gain_without_a_poorer_one_losing():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, cap = rng.integers(2, 7), rng.uniform(10, 100)
        d = rng.uniform(0, 60, n)
        a = max_min_fair(d, cap)
        assert a.sum() == pytest.approx(min(cap, d.sum()))
        assert np.all(a >= np.minimum(d, cap / n) - 1e-9)  # NJC: R/n to every job with demand ≥ R/n
        for j in np.flatnonzero(a < d - 1e-9):  # an unsatisfied job already holds the largest share: taking
            assert np.all(a <= a[j] + 1e-9)     # from anyone else would hurt a job no richer than it


def test_demand_recommendation_blends_the_conservative_and_exploratory_demands():
    grid = np.arange(101.0)
    job = JobView(JobSpec("a", 0.5), grid, np.clip((grid - 20) / 40, 0, 1), np.minimum(1, grid / 40))
    d_hat, d_bar = demand_bounds(job)
    assert (d_hat, d_bar) == (40.0, 30.0)
    assert recommend_demand(d_hat, d_bar, 0.75, None, 10) == pytest.approx(37.5)
    assert recommend_demand(d_hat, d_bar, 0.75, 20, 10) == pytest.approx(30.0)
    assert recommend_demand(d_hat, d_bar, 0.7, None, None) == pytest.approx(37.0)


def test_greedy_ew_moves_one_unit_from_the_best_off_to_the_worst_off():
    fb = [Feedback(20, 1, 1.0), Feedback(20, 1, 0.4), Feedback(20, 1, 0.2222)]
    snap = Snapshot(60, linear_jobs([10, 50, 90], 60, fb), previous={"j0": 20, "j1": 20, "j2": 20}, round_index=1)
    assert GreedyEW().decide(snap, np.random.default_rng(0)) == {"j0": 19.0, "j1": 20.0, "j2": 21.0}


def test_minerva_shares_follow_allocation_over_utility():
    shares = minerva_shares(np.array([20.0, 20, 20]), np.array([1, 0.4, 0.2222]))
    assert shares == pytest.approx([0.12566, 0.31259, 0.56175], abs=1e-4)


def small_snapshot(round_index=3, previous=None):
    fb = [Feedback(12, 1, 0.5), Feedback(12, 1, 0.3), Feedback(12, 1, 0.9), Feedback(14, 1, 0.2)]
    return Snapshot(50, linear_jobs([10, 30, 5, 45], 50, fb), previous=previous, round_index=round_index, max_change=4)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_stays_within_capacity_and_the_change_box_and_is_seeded(name):
    prev = {"j0": 12.0, "j1": 12.0, "j2": 12.0, "j3": 14.0}
    snap = small_snapshot(previous=prev)
    a = make_policy(name).decide(snap, np.random.default_rng(1))
    b = make_policy(name).decide(snap, np.random.default_rng(1))
    assert a == b
    vals = np.array(list(a.values()))
    assert np.all(vals >= 0) and vals.sum() <= 50 + 1e-9
    assert all(abs(a[k] - prev[k]) <= 4 + 1e-9 for k in prev)
    assert all(float(v).is_integer() for v in vals)


@pytest.mark.parametrize("name", ["resource-fair", "oracle-sw", "oracle-ew", "cilantro-sw", "cilantro-ew", "evoalg-sw"])
def test_welfare_and_fair_policies_use_the_whole_pool(name):
    snap = Snapshot(50, linear_jobs([10, 30, 5, 45], 50), round_index=2, max_change=None)
    assert sum(make_policy(name).decide(snap, np.random.default_rng(0)).values()) == 50


def test_fractional_granularity_gives_multiples_of_the_unit():
    grid = np.arange(0, 10.01, 0.25)
    jobs = tuple(JobView(JobSpec(f"j{i}", 1.0), grid, np.minimum(1, grid / d), np.minimum(1, grid / d)) for i, d in
                 enumerate([2.5, 6.0, 9.0]))
    snap = Snapshot(10, jobs, unit=0.25, round_index=1, max_change=None)
    alloc = make_policy("oracle-ew").decide(snap, np.random.default_rng(0))
    assert sum(alloc.values()) == pytest.approx(10)
    assert all((v / 0.25).is_integer() for v in alloc.values())
    assert min(min(1, v / d) for v, d in zip(alloc.values(), [2.5, 6.0, 9.0])) == pytest.approx(10 / 17.5, abs=0.03)


def test_policy_state_round_trips_and_the_restored_policy_decides_identically():
    for name in ["cilantro-njc", "evoalg-sw", "ernest", "quasar", "minerva", "parties", "miad"]:
        first = make_policy(name)
        snaps = [small_snapshot(round_index=r, previous={"j0": 12.0, "j1": 12.0, "j2": 12.0, "j3": 14.0}) for r in (1, 2, 12)]
        for s in snaps[:2]:
            first.decide(s, np.random.default_rng(0))
        restored = make_policy(name)
        import json

        restored.set_state(json.loads(json.dumps(first.get_state())))
        assert first.decide(snaps[2], np.random.default_rng(5)) == restored.decide(snaps[2], np.random.default_rng(5)), name


def test_unknown_policy_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="policy='nope'"):
        make_policy("nope")


def test_negative_capacity_is_a_config_error_naming_capacity():
    with pytest.raises(ConfigError, match="capacity=-5"):
        Snapshot(-5, linear_jobs([10], 10))


def test_a_job_without_an_slo_is_rejected_by_policies_that_need_one():
    grid = np.arange(11.0)
    jobs = (JobView(JobSpec("noslo", None), grid, grid / 10, grid / 10),)
    for name in ["cilantro-njc", "cilantro-sw", "oracle-ew"]:
        with pytest.raises(ConfigError, match="noslo.slo"):
            make_policy(name).decide(Snapshot(10, jobs, round_index=1), np.random.default_rng(0))
