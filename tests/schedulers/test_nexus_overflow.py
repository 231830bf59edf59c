"""Routing a capped plan's unassigned load onto GPUs (frontend routes all traffic, §5–6; dispatcher absorbs it)."""

from dataclasses import replace

import numpy as np
import pytest

from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session, SquishyPacker
from gpu.schedulers.nexus.overflow import route_unassigned
from gpu.schedulers.nexus.profiles import PAPER, linear_profile
from gpu.schedulers.nexus.synthetic import synthetic_profiles


def mixed_slo(total):
    return [Session(f"s{i}", "resnet50", float(slo), total / 16) for i, slo in enumerate(np.linspace(50, 200, 16))]


def routed_rate(plan, sid):
    return sum(p.rate for n in plan.nodes for p in n.placements if p.session_id == sid)


def test_hosted_session_overflow_follows_its_planned_shares_at_a_batch_within_its_slo():
    profiles = synthetic_profiles()
    sessions = mixed_slo(10500)
    plan = SquishyPacker(profiles).plan(sessions, max_gpus=8)
    lost = dict(plan.unassigned)
    assert lost
    routed = route_unassigned(plan, profiles)
    assert routed.unassigned == () and routed.num_gpus == plan.num_gpus
    shares = routed.rate_shares()
    for sid, by_node in plan.rate_shares().items():  # the routing table is unchanged
        assert shares[sid] == pytest.approx(by_node)
    for s in sessions:
        assert routed_rate(routed, s.session_id) == pytest.approx(s.rate)
    before = {(n.node_id, p.session_id): p for n in plan.nodes for p in n.placements}
    for n in routed.nodes:
        for p in n.placements:
            old = before[(n.node_id, p.session_id)]
            if p.session_id in lost:
                assert old.batch <= p.batch and p.worst_case_ms <= p.slo_ms + 1e-6
            else:
                assert p == old
    assert routed.violations()  # the overflow is not promised: the node it lands on is now overbooked


def test_session_without_a_gpu_goes_whole_to_the_node_with_most_headroom():
    prof = linear_profile("m", 1.0, 10.0, 64)
    full = SessionPlacement("a", "m", 100.0, 40, 800.0, 50.0, 100.0)
    half = SessionPlacement("b", "m", 100.0, 10, 200.0, 20.0, 70.0)
    sessions = (Session("a", "m", 100.0, 800.0), Session("b", "m", 100.0, 200.0), Session("c", "m", 100.0, 300.0))
    plan = Plan("squishy", "paper", (GpuNode(0, 50.0, (full,)), GpuNode(1, 50.0, (half,))), sessions,
                (("c", 300.0),))
    routed = route_unassigned(plan, {"m": prof})
    assert routed.nodes[0] == plan.nodes[0]
    c = routed.nodes[1].placements[-1]
    assert c.session_id == "c" and c.rate == pytest.approx(300.0)
    assert c.batch == 15 and c.worst_case_ms == pytest.approx(50.0 + PAPER.latency(prof, 15))  # ⌈50 ms × 300/s⌉


def test_plan_without_unassigned_load_is_returned_unchanged():
    plan = SquishyPacker(synthetic_profiles()).plan(mixed_slo(9000), max_gpus=8)
    assert route_unassigned(plan, synthetic_profiles()) is plan


def test_session_without_a_gpu_that_fits_no_gpu_memory_stays_unassigned():
    gib = 1 << 30
    prof = linear_profile("m", 1.0, 10.0, 64, memory_bytes=gib)
    node = GpuNode(0, 50.0, (SessionPlacement("a", "m", 100.0, 10, 200.0, 20.0, 70.0),), memory_bytes=gib)
    sessions = (Session("a", "m", 100.0, 200.0), Session("c", "m", 100.0, 300.0))
    plan = Plan("squishy", "paper", (node,), sessions, (("c", 300.0),))
    assert route_unassigned(plan, {"m": prof}, device_memory_bytes=2 * gib).nodes[0].placements[-1].session_id == "c"
    routed = route_unassigned(plan, {"m": prof}, device_memory_bytes=gib + gib // 2)
    assert routed.nodes == plan.nodes and routed.unassigned == (("c", 300.0),)


def full_and_idle_nodes(idle_duty_ms: float):
    """Session a fills GPU 0 (SLO 80 ms, ℓ(b) = b + 10 ms); GPU 1 hosts b at duty 40 ms; GPU 2 hosts c, idler."""
    a = SessionPlacement("a", "m", 80.0, 30, 750.0, 40.0, 80.0)
    b = SessionPlacement("b", "m", 80.0, 8, 200.0, 18.0, 58.0)
    c = SessionPlacement("c", "m", 200.0, 3, 100.0, 13.0, idle_duty_ms + 13.0)
    sessions = (Session("a", "m", 80.0, 950.0), Session("b", "m", 80.0, 200.0), Session("c", "m", 200.0, 100.0))
    nodes = (GpuNode(0, 40.0, (a,)), GpuNode(1, 40.0, (b,)), GpuNode(2, idle_duty_ms, (c,)))
    return nodes, sessions


def test_session_whose_gpu_is_full_spills_onto_a_gpu_that_did_not_host_it_within_its_slo():
    prof = linear_profile("m", 1.0, 10.0, 64)
    nodes, sessions = full_and_idle_nodes(60.0)  # GPU 2 idler, but 60 ms + ℓ(12) = 82 ms > a's 80 ms SLO
    routed = route_unassigned(Plan("squishy", "paper", nodes, sessions, (("a", 200.0),)), {"m": prof})
    assert routed.unassigned == () and routed.violations() == []
    assert routed.nodes[0] == nodes[0] and routed.nodes[2] == nodes[2]
    spilled = routed.nodes[1].placements[-1]
    assert spilled.session_id == "a" and spilled.rate == pytest.approx(200.0)
    assert spilled.batch == 8 and spilled.worst_case_ms == pytest.approx(40.0 + PAPER.latency(prof, 8))  # ⌈40 × 0.2⌉
    assert routed.rate_shares()["a"] == pytest.approx({0: 750 / 950, 1: 200 / 950})


def test_spilled_rate_splits_across_gpus_when_no_single_one_has_room_for_all_of_it():
    prof = linear_profile("m", 1.0, 10.0, 64)
    nodes, sessions = full_and_idle_nodes(30.0)
    routed = route_unassigned(Plan("squishy", "paper", nodes, sessions, (("a", 500.0),)), {"m": prof})
    assert routed.unassigned == () and routed.violations() == []
    # GPU 1 has 22 ms of slack: batch 12 (ℓ 22 ms) every 40 ms = 300 req/s; GPU 2 takes the other 200
    assert {n.node_id: routed_rate(Plan("x", "paper", (n,), sessions), "a") for n in routed.nodes} == \
        pytest.approx({0: 750.0, 1: 300.0, 2: 200.0})


@pytest.mark.parametrize("c_rate, c_batch, lands_on", [(100.0, 8, 2), (760.0, 57, 0)])
def test_overflow_that_fits_no_gpu_within_its_slo_goes_where_it_overbooks_least(c_rate, c_batch, lands_on):
    prof = linear_profile("m", 1.0, 10.0, 64)
    nodes, sessions = full_and_idle_nodes(75.0)  # GPU 2's 75 ms duty + ℓ(1) > a's 80 ms SLO
    b = replace(nodes[1].placements[0], rate=600.0, batch=24, latency_ms=34.0)  # GPU 1: 6 ms slack < ℓ(1)
    c = replace(nodes[2].placements[0], rate=c_rate, batch=c_batch, latency_ms=c_batch + 10.0)
    nodes = (nodes[0], GpuNode(1, 40.0, (b,)), GpuNode(2, 75.0, (c,)))
    routed = route_unassigned(Plan("squishy", "paper", nodes, sessions, (("a", 40.0),)), {"m": prof})
    # growing a on GPU 0 to batch 32 overbooks it by 2 ms; a new batch of 3 on GPU 2 costs ℓ(3) = 13 ms of its
    # slack: 57 ms when c is light (→ GPU 2), 8 ms when c is heavy (→ GPU 0)
    assert routed_rate(Plan("x", "paper", (routed.nodes[lands_on],), sessions), "a") == \
        pytest.approx(40.0 + (750.0 if lands_on == 0 else 0.0))
    assert routed.nodes[1] == nodes[1] and routed.nodes[2 - lands_on] == nodes[2 - lands_on]
