"""ESCHER's engine beyond the backend suite (``tests/test_escher_suite.py``): the composition warning, soft
constraints, the objective function, bin packing, WFQ, node specs, HFS and its monitor, EscherTune's consolidation,
and the GPU ghost on the local pool ledger and the simulator's ledger."""

from __future__ import annotations

import math

import pytest

from gpu.contract import contract_violations
from gpu.devices import simulated_nodes
from gpu.errors import AllocationTimeout, ConfigError
from gpu.ledger import PoolLedger
from gpu.placement import ResourceRequest
from gpu.schedulers.escher.api import Escher, NodeSpec, all_of, largest_remainder
from gpu.schedulers.escher.hfs import FairShareMonitor, HierarchicalFairShare, water_fill
from gpu.schedulers.escher.primitives import ElasticLoadBalancer, WeightedFairQueues, bin_packing, packing_preferences
from gpu.schedulers.escher.soft import SoftConstraint, allocate_preferred, objective_preferences, setup_objective
from gpu.schedulers.escher.tune import TrialProgress, consolidation, place_trial, spread_by_availability
from gpu.sim.escher.ledger import SimLedger

SPEC = simulated_nodes("1x16GiB", 3, cpus=4)


@pytest.fixture(params=["local", "sim"])
def ledger(request):
    lg = PoolLedger(SPEC, None) if request.param == "local" else SimLedger(SPEC)
    yield lg
    lg.close()


def grant(ledger, request: ResourceRequest):
    """Queue ``request`` and return its placement, or None while it waits."""
    return ledger.try_grant(ledger.submit(request))


def test_the_load_balancer_is_a_controller_growing_every_node_only_when_all_are_used():
    lb = ElasticLoadBalancer("web")
    assert contract_violations(lb) == []
    busy = {"node0": {"lb-web": (1.0, 0.0)}, "node1": {"lb-web": (1.0, 0.0)}}
    assert lb.on_arrival(0.0, busy, pending=1).deltas == (("lb-web", 1.0, "node0"), ("lb-web", 1.0, "node1"))
    assert not lb.on_arrival(0.0, busy, pending=0)
    assert not lb.on_job_done(0.0, {**busy, "node1": {"lb-web": (1.0, 1.0)}}, pending=3)


def test_a_resource_named_by_two_composed_policies_is_summed_with_a_warning(caplog):
    assert all_of({"a": 1, "b": 1}, {"a": 2}) == {"a": 3.0, "b": 1.0}
    assert "'a' is required by two policies" in caplog.text


def test_soft_constraints_on_the_local_ledger_fall_back_after_the_timeout():
    ledger = PoolLedger(SPEC, None)
    index, placement = allocate_preferred(ledger, ResourceRequest(cpus=1), [{"gpu-pref": 1}, {}], timeout=0.05)
    assert index == 1 and placement.cpus == 1
    Escher(ledger).set_resource("gpu-pref", 1, "node1")
    index, placement = allocate_preferred(ledger, ResourceRequest(cpus=1), [{"gpu-pref": 1}, {}], timeout=1)
    assert (index, placement.node) == (0, "node1")
    with pytest.raises(AllocationTimeout):
        allocate_preferred(ledger, ResourceRequest(cpus=1), [{"nowhere": 1}], timeout=0.05)
    with pytest.raises(ConfigError, match="preferences"):
        allocate_preferred(ledger, ResourceRequest(cpus=1), [], timeout=1)


def test_soft_constraint_reports_unschedulable_after_the_last_preference():
    soft = SoftConstraint([{"gpu": 1}, {"cpu": 1}], timeout=2)
    assert soft.on_arrival(0).wake_at == 2
    assert soft.on_timer(2).index == 1
    assert soft.on_timer(4).index is None
    running = SoftConstraint([{"gpu": 1}], timeout=2)
    running.on_arrival(0)
    running.on_heartbeat(1)
    assert running.on_timer(2) is None


def test_objective_function_preferences_halve_gamma(ledger):
    setup_objective(Escher(ledger), alpha=1, beta=1)
    prefs = objective_preferences(memory=0.5, cpu=0.5, alpha=1, beta=1, k=3)
    assert [p["obj"] for p in prefs] == [1.0, 0.5, 0.25, 0.125]
    assert grant(ledger, ResourceRequest(resources=prefs[0])) is not None
    with pytest.raises(ConfigError, match="memory"):
        objective_preferences(memory=1.5, cpu=0, alpha=1, beta=1)


def test_bin_packing_prefers_the_most_loaded_node_that_fits(ledger):
    esl = Escher(ledger)
    bin_packing(esl)
    grant(ledger, ResourceRequest(cpus=3, node="node1"))
    prefs = packing_preferences(esl.get_cluster_status(), {"CPU": 1})
    assert prefs[0] == {"pack-node1": 1.0}
    assert grant(ledger, ResourceRequest(cpus=1, resources=prefs[0])).node == "node1"
    assert packing_preferences(esl.get_cluster_status(), {"CPU": 2})[0] == {"pack-node0": 1.0}


def test_weighted_fair_queues_release_in_proportion_to_weights(ledger):
    wfq = WeightedFairQueues({"gold": 3, "silver": 1}, "node0")
    assert wfq.split(8, {"gold": 100, "silver": 100}) == {"gold": 6, "silver": 2}
    assert wfq.split(8, {"gold": 100, "silver": 0}) == {"gold": 8}
    esl = Escher(ledger)
    wfq.release(esl, 4, {"gold": 9, "silver": 9})
    assert esl.get_cluster_status()["node0"]["q-wfq-gold"] == (3.0, 3.0)


def test_node_spec_by_vector_num_nodes_and_bad_specs(ledger):
    esl = Escher(ledger)
    grant(ledger, ResourceRequest(cpus=4, node="node0"))
    assert esl.set_resource("x", 1, NodeSpec({"CPU": 2})) == ("node1", "node2")
    assert esl.set_resource("y", 1, NodeSpec({"CPU": 2}, num_nodes=1)) == ("node1",)
    assert esl.set_resource(None, 2, "node2", label="z") == ("node2",)
    for spec, field in ((NodeSpec({"CPU": 1}, num_nodes=3), "num_nodes"), ("node9", "node_spec"), (None, "node_spec")):
        with pytest.raises(ConfigError, match=field):
            esl.set_resource("x", 1, spec)
    for cap in (-1, math.nan):
        with pytest.raises(ConfigError, match="capacity"):
            esl.set_resource("x", cap, "node1")


def test_hfs_worked_example_of_fig_4_5c():
    root = HierarchicalFairShare([f"n{i}" for i in range(100)])
    org1, org2 = root.create_team("org1"), root.create_team("org2")
    assert org1.create_user("A", 2) == "res-A"
    org1.create_user("B", 3)
    org2.create_user("C", 1)
    assert contract_violations(root) == []
    busy = 10_000
    root.on_round(0, {"A": busy})
    assert {u: len(n) for u, n in root.shares().items()} == {"A": 100, "B": 0, "C": 0}
    moves = root.on_round(60, {"A": busy, "B": busy})
    assert {u: len(n) for u, n in root.shares().items()} == {"A": 40, "B": 60, "C": 0}
    assert sum(c.capacity == 0 for c in moves.calls) == 60          # A's resource leaves 60 nodes, B's arrives
    b_before = set(root.shares()["B"])
    root.on_round(120, {"A": busy, "B": busy, "C": busy})
    assert {u: len(n) for u, n in root.shares().items()} == {"A": 20, "B": 30, "C": 50}
    assert set(root.shares()["B"]) <= b_before                        # a shrinking team keeps B's warm nodes
    root.on_round(130, {"A": busy, "B": busy, "C": 10})              # C needs less: A and B take the rest
    assert {u: len(n) for u, n in root.shares().items()} == {"A": 36, "B": 54, "C": 10}
    with pytest.raises(ConfigError, match="user id"):
        org1.create_user("A")
    with pytest.raises(ConfigError, match="demands"):
        root.on_round(140, {"A": -1})


def test_the_hfs_monitor_hands_idle_nodes_on_every_period_and_keeps_a_users_busy_nodes():
    """Teams A (a) and B (b1, b2) on 4 nodes, 2/1/1. a's work ends while b1 still has 3 jobs: the next period gives
    a's nodes to b1. When b1 then needs fewer nodes than it holds, it keeps the ones its jobs run on."""
    root = HierarchicalFairShare([f"n{i}" for i in range(4)])
    root.create_team("A").create_user("a")
    team_b = root.create_team("B")
    team_b.create_user("b1")
    team_b.create_user("b2")
    monitor = FairShareMonitor(root, period_s=0.5)
    assert contract_violations(monitor) == []
    first = monitor.on_wake(0.0, {"a": 2, "b1": 3, "b2": 1})
    assert {u: len(n) for u, n in first.shares.items()} == {"a": 2, "b1": 1, "b2": 1} and first.wake_at == 0.5
    handed = monitor.on_wake(0.5, {"a": 0, "b1": 3, "b2": 1}, {"b1": first.shares["b1"], "b2": first.shares["b2"]})
    assert handed.shares["a"] == () and set(handed.shares["b1"]) == set(first.shares["a"]) | set(first.shares["b1"])
    assert all(c.capacity == 0 for c in handed.actions.calls if c.name == "res-a")
    busy = handed.shares["b1"][-1]                                  # b1's jobs now run on one node only
    shrunk = monitor.on_wake(1.0, {"a": 0, "b1": 1, "b2": 1}, {"b1": [busy], "b2": handed.shares["b2"]})
    assert shrunk.shares["b1"] == (busy,) and shrunk.shares["b2"] == handed.shares["b2"]
    with pytest.raises(ConfigError, match="period_s"):
        FairShareMonitor(root, period_s=0)


def test_eschertune_consolidates_a_spread_trial_where_all_its_workers_fit_while_the_move_pays():
    """Short jobs hold half of each node's GPU, so a two-worker trial of half a GPU each starts spread. Once a node
    has room for both (its own worker's half counted), a measured trial moves there, unless what it has left at its
    measured rate is shorter than its launch took: the same trial made 10x heavier (a tenth of the rate) moves."""
    ledger = PoolLedger(simulated_nodes("1x16GiB", 4, cpus=4), None)
    shorts = [ledger.allocate(ResourceRequest(gpus=0.5, node=f"node{i}")) for i in range(4)]
    counts = spread_by_availability(ledger.free_state(), 2, 0.5)
    assert counts == (("node0", 1), ("node1", 1))
    esl = Escher(ledger)
    place_trial(esl, "t", counts)
    workers = [ledger.allocate(ResourceRequest(gpus=0.5, resources={"trial-t": 1})) for _ in range(2)]
    assert sorted(w.node for w in workers) == ["node0", "node1"]
    placement = {"node0": 1, "node1": 1}
    light = TrialProgress(step=450, total=500, rate=100.0, launch_s=1.0)      # 0.5 s left, a launch costs 1 s
    heavy = TrialProgress(step=450, total=500, rate=10.0, launch_s=1.0)       # 5 s left
    assert consolidation(ledger.free_state(), placement, 0.5, heavy) is None  # no node has room for both yet
    ledger.release(shorts[1].lease_id)                                        # node1: its own half + a free half
    assert consolidation(ledger.free_state(), placement, 0.5, None) is None   # not measured yet
    assert consolidation(ledger.free_state(), placement, 0.5, light) is None
    moved = consolidation(ledger.free_state(), placement, 0.5, heavy)
    assert moved.nodes == {"node1": 2} and moved.remaining_s == pytest.approx(5.0)
    ledger.release(shorts[2].lease_id)                                        # node2 is empty: node1 keeps a worker
    assert consolidation(ledger.free_state(), placement, 0.5, heavy).nodes == {"node1": 2}
    assert consolidation(ledger.free_state(), {"node1": 2}, 0.5, heavy) is None  # together already
    place_trial(esl, "t", moved.counts)
    status = ledger.cluster_status()
    assert {n: r["trial-t"][0] for n, r in status.items() if "trial-t" in r} == {"node1": 2.0}
    for lease in [*workers, shorts[0], shorts[3]]:
        ledger.release(lease.lease_id)
    ledger.close()


def test_water_fill_and_largest_remainder():
    assert water_fill(10, [1, 1, 1], [1, 100, 100]) == [1, 5, 4]
    assert water_fill(10, [1, 1], [2, 3]) == [2, 3]
    assert largest_remainder(7, [1, 1]) == [4, 3]
    assert largest_remainder(0, [1]) == [0]


@pytest.mark.parametrize("kind", ["local", "sim"])
def test_a_gpu_ghost_lends_its_device_on_both_ledgers(kind):
    ledger = PoolLedger(SPEC, None) if kind == "local" else SimLedger(SPEC)
    ghost = grant(ledger, ResourceRequest(gpus=1, node="node2"))
    ledger.lease_resource(ghost.lease_id, "gang-x", 1)
    member = grant(ledger, ResourceRequest(resources={"gang-x": 1}))
    assert (member.node, member.devices) == ("node2", ghost.devices)
    ledger.release(member.lease_id)
    assert grant(ledger, ResourceRequest(gpus=1, node="node2")) is None          # still the ghost's, counted once
    ledger.release(ghost.lease_id)
    assert "gang-x" not in ledger.cluster_status()["node2"]
