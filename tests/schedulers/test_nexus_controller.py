"""The Nexus controller: one loop (epochs §6.3, routing §5, query chaining §6.2) for the simulator and the runtime."""

import numpy as np
import pytest

from gpu.contract import contract_violations, is_frozen_decision
from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session, SquishyPacker
from gpu.schedulers.nexus.chaining import QueryChains
from gpu.schedulers.nexus.controller import EpochDecision, NexusController, policy_names
from gpu.schedulers.nexus.epoch import EpochPlanner
from gpu.schedulers.nexus.profiles import linear_profile

PROFILES = {"m": linear_profile("m", 1.0, 10.0, 64)}


def two_stage_plan(budget_ms: float = 20.0) -> Plan:
    sessions = (Session("q/d", "m", 50.0, 20.0), Session("q/r", "m", budget_ms, 60.0))
    node = GpuNode(0, 40.0, (SessionPlacement("q/d", "m", 50.0, 8, 20.0, 10.0, 50.0),
                             SessionPlacement("q/r", "m", budget_ms, 8, 60.0, 5.0, 45.0)))
    return Plan("fixed", "paper", (node,), sessions)


def test_the_controller_follows_the_scheduler_contract():
    ctl = NexusController()
    assert contract_violations(ctl) == [] and ctl.system == "nexus" and ctl.hooks == ("on_epoch",)
    assert is_frozen_decision(ctl.on_epoch(1.0, {}))
    assert policy_names()[0] == "nexus" and "batch_oblivious" in policy_names()


def test_the_registry_names_this_controller_and_its_policies():
    from gpu.systems import SYSTEMS, resolve

    nexus = SYSTEMS["nexus"]
    assert resolve(nexus.controller) is NexusController and nexus.policy_names() == policy_names()


def test_an_unknown_policy_or_clock_is_one_config_error_naming_it():
    with pytest.raises(ConfigError, match="policy.*'nexsu'"):
        NexusController(policy="nexsu")
    with pytest.raises(ConfigError, match="time_unit.*'s'"):
        NexusController(time_unit="s")
    with pytest.raises(ConfigError, match="chains"):
        NexusController(chains={"a": ("b", 1.0), "b": ("a", 1.0)})


def test_the_policy_names_the_load_balancer_the_paper_gives_it():
    """§7.2: Nexus and its ablations route with Nexus's DRR frontend, the Clipper/TF-like baselines do not."""
    assert NexusController(policy="nexus").router.kind == "drr"
    assert NexusController(policy="batch_oblivious_lazy_drop").router.kind == "weighted_random"
    assert NexusController(policy="batch_oblivious_lazy_drop", load_balancer="drr").router.kind == "drr"


def test_a_steady_load_ticks_the_epoch_timer_but_keeps_the_plan():
    ctl = NexusController(EpochPlanner(SquishyPacker(PROFILES), [Session("s", "m", 100, 100.0)]))
    first = ctl.plan
    decisions = [ctl.on_epoch(float(t), {"s": 100.0}) for t in range(1, 31)]
    assert [d.epoch for d in decisions].index(True) == 29  # the 30 s epoch timer, nothing earlier
    assert not any(d.replanned for d in decisions) and decisions[-1] == EpochDecision(first, True, False)


def test_a_load_jump_makes_an_epoch_decide_a_bigger_plan():
    ctl = NexusController(EpochPlanner(SquishyPacker(PROFILES), [Session("s", "m", 100, 100.0)]))
    before = ctl.plan
    decisions = [ctl.on_epoch(float(t), {"s": 100.0 if t <= 30 else 2000.0}) for t in range(1, 46)]
    new = next(d for d in decisions[30:] if d.replanned)
    assert new.epoch and new.plan is ctl.plan and new.plan.num_gpus > before.num_gpus


def test_a_fixed_plan_controller_never_replans():
    ctl = NexusController()
    assert ctl.on_epoch(100.0, {"s": 1e6}) == EpochDecision(None)


def test_routing_follows_the_installed_plan_shares_with_drr():
    """Shares 4:2:1 over three GPUs → DRR picks exactly 40/20/10 of 70 requests, in the authors' order."""
    nodes = tuple(GpuNode(i, 100.0, (SessionPlacement("s", "m", 50.0, 1, rate, 1.0, 51.0),))
                  for i, rate in enumerate((40.0, 20.0, 10.0)))
    ctl = NexusController()
    ctl.install(Plan("fixed", "paper", nodes, (Session("s", "m", 50.0, 70.0),)))
    pick = ctl.route("s", {0: "gpu0", 1: "gpu1", 2: "gpu2"})
    picks = pick.pick_many(70)
    assert pick.targets == ["gpu0", "gpu1", "gpu2"] and np.bincount(picks).tolist() == [40, 20, 10]
    assert picks[:7].tolist() == [0, 0, 0, 0, 1, 1, 2]
    assert ctl.route("elsewhere", {}) is None


def test_an_on_time_parent_issues_children_due_by_its_deadline_plus_the_child_budget():
    """§6.2 slack propagation: a frame finished at 35 ms with deadline 50 issues recognitions due at 50 + 20;
    the frame that missed its 30 ms deadline issues none (its query is bad already)."""
    ctl = NexusController(chains={"q/r": ("q/d", 3.0)})
    ctl.install(two_stage_plan(20.0))
    (issue,) = ctl.chain(35.0, "q/d", np.array([50.0, 30.0]))
    assert issue.session_id == "q/r" and set(issue.parents.tolist()) == {0}
    assert np.all(issue.deadlines == 70.0)
    assert ctl.chain(35.0, "q/d", np.array([30.0])) == () and ctl.chain(35.0, "q/r", np.array([70.0])) == ()


def test_a_parent_finishing_exactly_at_its_deadline_is_on_time_despite_float_rounding():
    ctl = NexusController(chains={"q/r": ("q/d", 50.0)})
    ctl.install(two_stage_plan())
    assert ctl.chain(0.1 + 0.2, "q/d", np.array([0.3]))  # 0.30000000000000004 > 0.3 by rounding only


def test_fan_out_averages_gamma_per_on_time_parent():
    ctl = NexusController(chains={"q/r": ("q/d", 2.5)}, rng=7)
    ctl.install(two_stage_plan())
    issued = sum(len(i.parents) for _ in range(200) for i in ctl.chain(0.0, "q/d", np.full(50, 10.0)))
    assert issued / 10_000 == pytest.approx(2.5, rel=0.03)


def test_the_runtime_clock_chains_the_same_children_in_integer_nanoseconds():
    """One implementation, two clocks: the same seed issues the same children in ms (simulator) and ns
    (runtime), and the runtime's deadlines stay exact integers."""
    ms, ns = (QueryChains({"q/r": ("q/d", 2.0)}, rng=3, time_unit=u) for u in ("ms", "ns"))
    ms.set_plan(two_stage_plan(20.0), {"q/r": 1.5})
    ns.set_plan(two_stage_plan(20.0), {"q/r": 1.5})
    a = ms.issue(35.0, "q/d", np.array([50.0, 60.0, 70.0]))[0]
    b = ns.issue(35_000_000, "q/d", np.array([50_000_000, 60_000_000, 70_000_000], np.int64))[0]
    assert a.parents.tolist() == b.parents.tolist() and len(a.parents) > 0
    assert b.deadlines.dtype == np.int64 and (b.deadlines == a.deadlines * 1_000_000).all()
    assert ms.budget("q/r") == 21.5 and ns.budget("q/r") == 21_500_000


def test_every_stage_knows_its_query_root_and_depth():
    chains = QueryChains({"q/b": ("q/a", 1.0), "q/c": ("q/b", 1.0)})
    assert chains.roots == {"q/a": "q/a", "q/b": "q/a", "q/c": "q/a"}
    assert [chains.depth(s) for s in ("q/a", "q/b", "q/c")] == [0, 1, 2] and chains.parents == {"q/a", "q/b"}


def test_a_batch_of_one_chains_like_a_batch_of_many():
    """The runtime passes a lone request's deadline as an int: same children, exact integer deadlines."""
    one, many = (QueryChains({"q/r": ("q/d", 2.0)}, rng=5, time_unit="ns") for _ in range(2))
    one.set_plan(two_stage_plan(20.0))
    many.set_plan(two_stage_plan(20.0))
    for due in (50_000_000, 60_000_000, 30_000_000):  # the last one is late at 35 ms: no children
        a = one.issue(35_000_000, "q/d", due)
        b = many.issue(35_000_000, "q/d", np.array([due], np.int64))
        assert [(i.parents.tolist(), i.deadlines.tolist()) for i in a] == \
               [(i.parents.tolist(), i.deadlines.tolist()) for i in b]
        assert all(i.deadlines.dtype == np.int64 and (i.deadlines == due + 20_000_000).all() for i in a)
    assert one.issue(35_000_000, "q/d", 30_000_000) == ()
