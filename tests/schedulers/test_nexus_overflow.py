"""Routing a capped plan's unassigned load onto GPUs (frontend routes all traffic, §5–6; dispatcher absorbs it)."""

import numpy as np
import pytest

from gpu.schedulers.nexus import GpuNode, Placement, Plan, Session, SquishyPacker
from gpu.schedulers.nexus_overflow import route_unassigned
from gpu.schedulers.nexus_profiles import PAPER, linear_profile
from gpu.schedulers.nexus_synthetic import synthetic_profiles


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
    full = Placement("a", "m", 100.0, 40, 800.0, 50.0, 100.0)
    half = Placement("b", "m", 100.0, 10, 200.0, 20.0, 70.0)
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
    node = GpuNode(0, 50.0, (Placement("a", "m", 100.0, 10, 200.0, 20.0, 70.0),), memory_bytes=gib)
    sessions = (Session("a", "m", 100.0, 200.0), Session("c", "m", 100.0, 300.0))
    plan = Plan("squishy", "paper", (node,), sessions, (("c", 300.0),))
    assert route_unassigned(plan, {"m": prof}, device_memory_bytes=2 * gib).nodes[0].placements[-1].session_id == "c"
    routed = route_unassigned(plan, {"m": prof}, device_memory_bytes=gib + gib // 2)
    assert routed.nodes == plan.nodes and routed.unassigned == (("c", 300.0),)
