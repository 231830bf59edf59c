"""Squishy bin packing (Nexus §6.1, Algorithm 1): the paper's Table 2 example, code-preset plans, invariants."""

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import (Session, SquishyPacker, batch_oblivious_plan, ceil_batch, gpu_lower_bound)
from gpu.schedulers.nexus.profiles import linear_profile, published_profiles, table_profile
from gpu.schedulers.nexus.synthetic import synthetic_profiles

TOY = {"A": table_profile("A", {4: 50, 8: 75, 16: 100}), "B": table_profile("B", {4: 50, 8: 90, 16: 125}),
       "C": table_profile("C", {4: 60, 8: 95, 16: 125})}


def toy_sessions(ra, rb, rc):
    return [Session("A", "A", 200, ra), Session("B", "B", 250, rb), Session("C", "C", 250, rc)]


def layout(plan):
    return [(round(n.duty_cycle_ms, 3), round(n.occupancy, 4), tuple((p.session_id, p.batch) for p in n.placements))
            for n in plan.nodes]


def test_table2_high_load_saturates_then_leaves_residuals():
    plan = SquishyPacker(TOY).plan(toy_sessions(400, 160, 300))
    saturated = [n.placements[0].session_id for n in plan.nodes if n.saturated]
    assert saturated == ["A", "A", "B", "C", "C"]
    assert all(n.placements[0].batch == 16 for n in plan.nodes if n.saturated)
    residual = {n.placements[0].session_id: n for n in plan.nodes if not n.saturated}
    assert residual["A"].placements[0].batch == 8 and residual["A"].duty_cycle_ms == pytest.approx(100)
    assert residual["A"].occupancy == pytest.approx(0.75)
    assert residual["B"].duty_cycle_ms == pytest.approx(125) and residual["B"].occupancy == pytest.approx(0.40)
    assert residual["C"].duty_cycle_ms == pytest.approx(1000 * 4 / 44) and residual["C"].occupancy == pytest.approx(0.66)


def test_table2_low_load_colocates_b_with_a_but_not_c():
    plan = SquishyPacker(TOY).plan(toy_sessions(64, 32, 32))
    assert layout(plan) == [(125.0, 1.0, (("A", 8), ("B", 4))), (125.0, 0.48, (("C", 4),))]
    worst = {p.session_id: p.worst_case_ms for n in plan.nodes for p in n.placements}
    assert worst == pytest.approx({"A": 200, "B": 175, "C": 185})


@pytest.mark.parametrize("rate,batch,duty_us,occ", [(50, 21, 420000.0, 0.1747), (100, 37, 365944.1, 0.3531),
                                                    (150, 50, 326673.7, 0.5157), (250, 66, 261084.1, 0.8965)])
def test_code_preset_vgg16_residual_plans_match_the_authors_tests(rate, batch, duty_us, occ):
    plan = SquishyPacker(published_profiles(), "code").plan([Session("v", "vgg16", 500, rate)])
    (node,) = plan.nodes
    assert node.placements[0].batch == batch
    assert node.duty_cycle_ms * 1000 == pytest.approx(duty_us, rel=1e-3)
    assert node.occupancy == pytest.approx(occ, abs=1e-4)


@pytest.mark.parametrize("rate,accepted,batches", [(50, True, [38, 13]), (125, True, [32, 26]), (150, False, None)])
def test_code_preset_merge_of_vgg_face_onto_vgg16(rate, accepted, batches):
    plan = SquishyPacker(published_profiles(), "code").plan(
        [Session("v", "vgg16", 500, 150), Session("f", "vgg_face", 300, rate)])
    assert (plan.num_gpus == 1) == accepted
    if accepted:
        assert [p.batch for p in plan.nodes[0].placements] == batches


@pytest.mark.parametrize("preset,batch,rate,residual_batch,duty_us", [("code", 28, 290.60, 17, 135961.8),
                                                                     ("paper", 29, 293.67, 16, 142008.2)])
def test_saturate_plus_residual_for_vgg16_at_700_rps(preset, batch, rate, residual_batch, duty_us):
    plan = SquishyPacker(published_profiles(), preset).plan([Session("v", "vgg16", 200, 700)])
    sat = [n for n in plan.nodes if n.saturated]
    assert len(sat) == 2 and sat[0].placements[0].batch == batch
    assert sat[0].placements[0].rate == pytest.approx(rate, rel=1e-3)
    (res,) = [n for n in plan.nodes if not n.saturated]
    assert res.placements[0].batch == residual_batch
    assert res.duty_cycle_ms * 1000 == pytest.approx(duty_us, rel=1e-3)
    assert sum(p.rate for n in plan.nodes for p in n.placements) == pytest.approx(700)


def random_workload(rng, n):
    profiles = {f"m{i}": linear_profile(f"m{i}", rng.uniform(0.2, 3), rng.uniform(1, 20), 128) for i in range(4)}
    sessions = [Session(f"s{i}", f"m{rng.integers(4)}", float(rng.uniform(60, 400)), float(rng.uniform(1, 600)))
                for i in range(n)]
    return profiles, sessions


@pytest.mark.parametrize("seed", range(12))
def test_random_plans_meet_every_slo_and_never_overbook_a_gpu(seed):
    rng = np.random.default_rng(seed)
    profiles, sessions = random_workload(rng, int(rng.integers(3, 14)))
    plan = SquishyPacker(profiles).plan(sessions)
    assert plan.violations() == []
    for node in plan.nodes:
        assert node.occupancy <= 1 + 1e-6
        for p in node.placements:
            assert p.worst_case_ms <= p.slo_ms + 1e-6
            assert 1000 * p.batch / node.duty_cycle_ms >= p.rate - 1e-6  # served rate ≥ routed rate
    served = {s.session_id: 0.0 for s in sessions}
    for node in plan.nodes:
        for p in node.placements:
            served[p.session_id] += p.rate
    assert served == pytest.approx({s.session_id: s.rate for s in sessions})
    alone = SquishyPacker(profiles, colocate=False).plan(sessions)
    assert gpu_lower_bound(sessions, profiles) - 1e-9 <= plan.num_gpus <= alone.num_gpus


def test_batch_oblivious_baseline_breaks_slos_where_squishy_packing_does_not():
    sessions = toy_sessions(64, 32, 32)
    oblivious = batch_oblivious_plan(sessions, TOY)
    assert oblivious.num_gpus == 1 and oblivious.violations()
    assert SquishyPacker(TOY).plan(sessions).violations() == []


def test_batch_oblivious_shares_fill_the_given_cluster():
    plan = batch_oblivious_plan(toy_sessions(64, 32, 32), TOY, gpus=3)
    assert plan.num_gpus == 3
    assert sum(plan.rate_shares()["A"].values()) == pytest.approx(1.0)


def test_rate_shares_split_a_session_by_served_rate():
    plan = SquishyPacker(TOY).plan(toy_sessions(400, 160, 300))
    shares = plan.rate_shares()["A"]
    assert sorted(shares.values()) == pytest.approx([0.2, 0.4, 0.4])


def test_ceil_batch_forgives_float_noise_only_above_an_integer():
    assert (ceil_batch(8.0000001), ceil_batch(7.2), ceil_batch(0.0004)) == (8, 8, 1)


def test_slo_below_batch1_latency_is_a_config_error_naming_the_session():
    with pytest.raises(ConfigError, match=r"fast\.slo_ms"):
        SquishyPacker(published_profiles()).plan([Session("fast", "vgg16", 10, 50)])


def test_unknown_model_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"s1\.model=.*resnet"):
        SquishyPacker(published_profiles()).plan([Session("s1", "resnet", 100, 50)])


def test_negative_rate_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"s1\.rate=-5"):
        Session("s1", "vgg16", 100, -5)


def test_unknown_preset_is_a_config_error():
    with pytest.raises(ConfigError, match="preset"):
        SquishyPacker(TOY, "fast")


def test_batch_oblivious_runs_every_session_at_its_solo_max_batch_interleaved():
    sessions = [Session(f"s{i}", "resnet50", slo, 300.0) for i, slo in enumerate((50, 80, 120, 200, 60, 90))]
    profiles = synthetic_profiles()
    plan = batch_oblivious_plan(sessions, profiles, gpus=2)
    # the largest batch with 2·ℓ(b) ≤ SLO (paper preset) of the synthetic ResNet-50, capped at its max batch 128
    solo = {f"s{i}": b for i, b in enumerate((32, 57, 90, 128, 40, 65))}
    assert {p.session_id: p.batch for n in plan.nodes for p in n.placements} == solo
    shared = [n for n in plan.nodes if len(n.placements) > 1]
    assert shared  # co-located models interleave round-robin: the duty cycle is one solo max batch of each
    for n in shared:
        assert n.duty_cycle_ms == pytest.approx(sum(profiles["resnet50"].latency(p.batch) for p in n.placements))


def mixed_slo(total):
    return [Session(f"s{i}", "resnet50", float(slo), total / 16) for i, slo in enumerate(np.linspace(50, 200, 16))]


def test_capped_plan_splits_residual_rates_into_the_cluster_instead_of_opening_a_gpu():
    packer = SquishyPacker(synthetic_profiles())
    assert packer.plan(mixed_slo(9000)).num_gpus == 9
    plan = packer.plan(mixed_slo(9000), max_gpus=8)
    assert plan.num_gpus == 8 and plan.unassigned == () and plan.violations() == []
    assert any(len(shares) > 1 for shares in plan.rate_shares().values())
    assert all(plan.served_fraction(s.session_id) == pytest.approx(1.0) for s in plan.sessions)


def test_capped_plan_reports_the_load_it_cannot_place():
    sessions = mixed_slo(10500)
    plan = SquishyPacker(synthetic_profiles()).plan(sessions, max_gpus=8)
    assert plan.num_gpus == 8 and plan.violations() == []
    lost = dict(plan.unassigned)
    assert lost and all(r > 0 for r in lost.values())
    for s in sessions:
        placed = sum(p.rate for n in plan.nodes for p in n.placements if p.session_id == s.session_id)
        assert placed + lost.get(s.session_id, 0.0) == pytest.approx(s.rate)


def test_capped_plan_with_fewer_gpus_than_saturated_nodes_leaves_the_rest_unassigned():
    plan = SquishyPacker(TOY).plan(toy_sessions(400, 160, 300), max_gpus=2)
    assert plan.num_gpus == 2 and all(n.saturated for n in plan.nodes)
    assert sum(r for _, r in plan.unassigned) == pytest.approx(860 - 2 * 160)


def test_max_gpus_below_one_is_a_config_error():
    with pytest.raises(ConfigError, match="gpus=0"):
        SquishyPacker(TOY).plan(toy_sessions(64, 32, 32), max_gpus=0)
