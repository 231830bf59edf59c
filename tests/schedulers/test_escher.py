"""ESCHER's policy suite (thesis §4.4, Table 4.2; the correctness targets of the reproduction) on the
local pool ledger and on the simulator's ledger: the same ESL calls, the same assertions."""

from __future__ import annotations

import math

import pytest

from gpu.contract import contract_violations
from gpu.devices import simulated_nodes
from gpu.errors import AllocationTimeout, ConfigError
from gpu.ledger import PoolLedger
from gpu.placement import FifoBestFit, ResourceRequest
from gpu.schedulers.escher.api import Escher, NodeSpec, all_of, largest_remainder
from gpu.schedulers.escher.hfs import HierarchicalFairShare, water_fill
from gpu.schedulers.escher.primitives import (
    ElasticLoadBalancer, Queue, WeightedFairQueues, after, anti_affinity, bin_packing, colocate, packing_preferences,
    signal, store_data, with_task,
)
from gpu.schedulers.escher.soft import SoftConstraint, allocate_preferred, objective_preferences, setup_objective
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


def over_capacity(ledger) -> list[str]:
    """Guarantee 2 of §4.3: no node allocated past its capacity, physical or ephemeral."""
    return [f"{n}:{k}" for n, res in ledger.cluster_status().items() for k, (cap, free) in res.items()
            if free < -1e-9 and k in ("CPU", "GPU")]


def test_colocated_task_lands_on_its_partners_node(ledger):
    producer = grant(ledger, ResourceRequest(cpus=1, label="t1", node="node1"))
    Escher(ledger, caller_node=producer.node).set_resource("coloc-t1", 1e6)     # P1, run by T1
    partners = [grant(ledger, ResourceRequest(cpus=1, resources=with_task("t1"))) for _ in range(3)]
    assert {p.node for p in partners} == {"node1"}
    assert over_capacity(ledger) == []


def test_colocate_helper_runs_on_the_callers_node(ledger):
    esl = Escher(ledger, caller_node="node2")
    assert colocate(esl, "p7") == {"coloc-p7": 1.0}
    assert grant(ledger, ResourceRequest(resources=with_task("p7"))).node == "node2"


def test_anti_affine_tasks_run_on_distinct_nodes_and_a_fourth_waits(ledger):
    need = anti_affinity(Escher(ledger), "trials")
    placed = [grant(ledger, ResourceRequest(cpus=1, resources=need)) for _ in range(4)]
    assert len({p.node for p in placed[:3]}) == 3
    assert placed[3] is None


def test_elastic_load_balancing_spreads_within_one_task_per_node(ledger):
    esl, lb = Escher(ledger), ElasticLoadBalancer("web")
    esl.apply(lb.setup(esl.get_cluster_status()))
    assert contract_violations(lb) == []
    tickets = []
    for i in range(10):
        tickets.append(ledger.submit(ResourceRequest(resources=lb.requirement, label=f"w{i}")))
        pending = sum(ledger.try_grant(t) is None for t in tickets)
        esl.apply(lb.on_arrival(float(i), esl.get_cluster_status(), pending))
    counts = {}
    for t in tickets:
        p = ledger.try_grant(t)
        counts[p.node] = counts.get(p.node, 0) + 1
    assert sum(counts.values()) == 10 and max(counts.values()) - min(counts.values()) <= 1


def test_t2_queued_before_t1_runs_after_t1_signals_under_fifo(ledger):
    """P2 under the default FIFO: the consumer waits off the head, the producer goes first."""
    assert isinstance(ledger.policy, FifoBestFit) and not ledger.policy.backfill
    t2 = ledger.submit(ResourceRequest(cpus=1, resources=after("t1"), label="t2"))
    t1 = grant(ledger, ResourceRequest(cpus=1, label="t1"))
    assert t1 is not None and ledger.try_grant(t2) is None
    ledger.release(t1.lease_id)
    signal(Escher(ledger), "t1")                                       # T1 ends
    assert ledger.try_grant(t2).label == "t2"


def test_a_barrier_waits_for_every_predecessor(ledger):
    esl = Escher(ledger)
    t = ledger.submit(ResourceRequest(resources=after("a", "b")))
    signal(esl, "a")
    assert ledger.try_grant(t) is None
    signal(esl, "b")
    assert ledger.try_grant(t) is not None


def test_a_queue_lets_exactly_the_released_batch_through(ledger):
    esl, q = Escher(ledger), Queue("jobs", "node0")
    wrappers = [ledger.submit(ResourceRequest(resources=q.requirement, label=f"w{i}")) for i in range(5)]
    q.release(esl, 2)
    through = []
    for w in wrappers:
        p = ledger.try_grant(w)
        if p is not None:
            q.take(esl)                     # the wrapper consumes its unit, submits the real task, exits
            ledger.release(p.lease_id)
            through.append(w)
    assert through == wrappers[:2]
    assert all(ledger.try_grant(w) is None for w in wrappers[2:])


def test_data_locality_runs_the_mapper_where_the_chunk_was_written(ledger):
    need = store_data(Escher(ledger, caller_node="node2"), "chunk-9")
    assert grant(ledger, ResourceRequest(cpus=1, resources=need)).node == "node2"


def test_a_resource_named_by_two_composed_policies_is_summed_with_a_warning(caplog):
    assert all_of({"a": 1, "b": 1}, {"a": 2}) == {"a": 3.0, "b": 1.0}
    assert "'a' is required by two policies" in caplog.text


def test_composition_concatenates_and_conflict_relaxation_drops_anti_affinity(ledger):
    esl = Escher(ledger)
    esl.set_resource("fair_a", 10, NodeSpec())
    anti = anti_affinity(esl, "x")
    both = all_of({"fair_a": 1}, anti)
    assert both == {"fair_a": 1.0, "anti-x": 1.0}
    assert all_of({"a": 1}, {"a": 2}) == {"a": 3.0}                    # a collision is summed, and said
    placed = [grant(ledger, ResourceRequest(resources=both)) for _ in range(3)]
    assert len({p.node for p in placed}) == 3
    soft = SoftConstraint([both, {"fair_a": 1}], timeout=1.0)
    first = soft.on_arrival(0.0)
    attempt = ledger.submit(ResourceRequest(resources=first.resources))
    assert first.index == 0 and ledger.try_grant(attempt) is None
    relaxed = soft.on_timer(1.0)
    ledger.cancel(attempt)                                             # the ESL cancels before resubmitting
    assert relaxed.index == 1 and grant(ledger, ResourceRequest(resources=relaxed.resources)) is not None


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


def test_replay_restores_resources_of_a_lost_node_elsewhere_and_after_a_restart(tmp_path):
    sim = SimLedger(SPEC)
    log = str(tmp_path / "esl.jsonl")
    esl = Escher(sim, log_path=log)
    esl.set_resource("data-1", 5, "node1")
    esl.set_resource("lb", 1, NodeSpec())
    sim.fail_node("node1")
    actions = esl.replay()
    assert [(c.name, c.node) for c in actions.calls] == [("data-1", "node0")]
    assert sim.cluster_status()["node0"]["data-1"] == (5.0, 5.0)
    restarted = Escher(sim, log_path=log)                                   # the ESL daemon restarts
    assert {(c.name, c.node) for c in restarted.logged()} == {("data-1", "node0"), ("lb", "node0"), ("lb", "node1"),
                                                              ("lb", "node2")}
    sim.restore_node("node1")
    restarted.replay()
    assert sim.cluster_status()["node1"]["lb"] == (1.0, 1.0)             # reinitialized on the restored node


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


def test_water_fill_and_largest_remainder():
    assert water_fill(10, [1, 1, 1], [1, 100, 100]) == [1, 5, 4]
    assert water_fill(10, [1, 1], [2, 3]) == [2, 3]
    assert largest_remainder(7, [1, 1]) == [4, 3]
    assert largest_remainder(0, [1]) == [0]


def test_appspace_gang_on_the_local_ledger_rolls_back_then_runs_all_or_none():
    """Gang of 8 one-CPU members on 12 CPUs with 6 taken: the ghosts time out, roll back (``gang-g0``
    deleted, their CPUs freed); once the blocker ends, every ghost runs and the members land on them."""
    from gpu.schedulers.escher.gang import AppSpaceGang, Gang

    ledger = PoolLedger(SPEC, None)
    esl = Escher(ledger)
    blocker = ledger.allocate(ResourceRequest(cpus=3, node="node0"))
    ledger.allocate(ResourceRequest(cpus=3, node="node1"))
    gang = AppSpaceGang(Gang("g0", tuple(ResourceRequest(cpus=1) for _ in range(8))), timeout=1.0)
    step = gang.on_arrival(0.0)
    tickets = {i: ledger.submit(gang.gang.ghost(i)) for i in step.submit}
    ghosts = []
    for i, t in tickets.items():
        p = ledger.try_grant(t)
        if p is not None:
            ghosts.append(p)
            esl.apply(gang.on_ghost_started(0.1, i, p.node).actions)
    assert not gang.done and sum(c for c, _ in (ledger.cluster_status()[n].get("gang-g0", (0, 0))
                                                for n in ("node0", "node1", "node2"))) == 6
    rollback = gang.on_timer(step.wake_at)
    assert rollback.rollback and rollback.wake_at > step.wake_at
    for t in tickets.values():
        ledger.cancel(t)                        # the waiting ghosts are withdrawn,
    for p in ghosts:
        ledger.release(p.lease_id)              # the running ones end
    esl.apply(rollback.actions)
    assert len(ledger.leases()) == 2
    assert not any("gang-g0" in res for res in ledger.cluster_status().values())
    ledger.release(blocker.lease_id)
    retry = gang.on_retry(rollback.wake_at)
    launched = ()
    for i in retry.submit:
        p = ledger.try_grant(ledger.submit(gang.gang.ghost(i)))
        assert p is not None
        s = gang.on_ghost_started(2.0, i, p.node)
        esl.apply(s.actions)
        launched = s.launch or launched
    assert gang.done and len(launched) == 8
    members = [ledger.try_grant(ledger.submit(m)) for m in launched]
    assert all(m is not None and m.cpus == 0 for m in members)


def test_framespace_grant_all_is_all_or_none_on_the_ledger(ledger):
    ledger_busy = grant(ledger, ResourceRequest(cpus=4, node="node0"))
    assert ledger_busy is not None
    assert ledger.grant_all([ResourceRequest(cpus=4)] * 3) is None               # 2 free nodes for 3 bundles: none
    assert len(ledger.leases()) == 1
    gang = ledger.grant_all([ResourceRequest(cpus=4)] * 2)
    assert sorted(p.node for p in gang) == ["node1", "node2"]


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
