"""Multi-parent query stages: a join runs once per query, after all its parents (Nona §I: tasks take their parents' outputs; a ResNet block)."""

import numpy as np
import pytest

from gpu.systems import make_batch_policy as make_policy
from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session
from gpu.schedulers.nexus.chaining import QueryChains
from gpu.schedulers.nexus.profiles import linear_profile
from gpu.sim.nexus.engine import simulate_plan

DIAMOND = {"q/b": ("q/a", 1.0), "q/c": ("q/a", 1.0), "q/d": (("q/b", "q/c"), 1.0)}  # a → {b, c} → d


def diamond_plan() -> Plan:
    sessions = tuple(Session(f"q/{u}", "m", 20.0, 20.0) for u in "abcd")
    node = GpuNode(0, 20.0, tuple(SessionPlacement(f"q/{u}", "m", 20.0, 4, 20.0, 2.0, 20.0) for u in "abcd"))
    return Plan("fixed", "paper", (node,), sessions)


def test_each_branch_of_a_diamond_is_issued_exactly_once_per_query():
    """A query with a join is a job of tasks: γ = 1 issues one child per parent request, no Poisson draw."""
    chains = QueryChains(DIAMOND, rng=0)
    chains.set_plan(diamond_plan())
    issues = chains.issue(0.0, "q/a", np.full(500, 20.0), queries=np.arange(500))
    assert sorted(i.session_id for i in issues) == ["q/b", "q/c"]
    assert all(len(i.parents) == 500 and (i.parents == np.arange(500)).all() for i in issues)
    assert all((i.deadlines == 40.0).all() for i in issues)  # the parent's deadline + the stage's 20 ms


def test_a_join_runs_once_after_its_last_parent_with_the_latest_deadline():
    chains = QueryChains(DIAMOND, rng=0)
    chains.set_plan(diamond_plan())
    assert chains.issue(30.0, "q/b", np.array([40.0, 40.0]), queries=np.array([7, 8])) == ()  # c not yet
    (done,) = chains.issue(35.0, "q/c", np.array([45.0]), queries=np.array([7]))
    assert done.session_id == "q/d" and done.parents.tolist() == [0] and done.deadlines.tolist() == [65.0]
    assert chains.issue(36.0, "q/c", np.array([45.0]), queries=np.array([7])) == ()  # a repeat opens a new join
    (late,) = chains.issue(39.0, "q/c", np.array([45.0]), queries=np.array([8]))
    assert late.parents.tolist() == [0]
    assert chains.issue(50.0, "q/b", np.array([40.0]), queries=np.array([9])) == ()
    assert chains.issue(51.0, "q/c", np.array([60.0]), queries=np.array([9])) == ()  # b was late: query lost


def test_a_join_needs_the_queries_of_its_parents_requests():
    chains = QueryChains(DIAMOND)
    with pytest.raises(ConfigError, match="queries"):
        chains.issue(0.0, "q/b", np.array([40.0]))


def test_joins_are_checked_before_anything_runs():
    with pytest.raises(ConfigError, match="gamma"):
        QueryChains({**DIAMOND, "q/b": ("q/a", 2.0)})
    with pytest.raises(ConfigError, match="one query"):
        QueryChains({"p/b": ("p/a", 1.0), "q/d": (("p/b", "q/a"), 1.0)})
    with pytest.raises(ConfigError, match="ancestor"):
        QueryChains({"q/b": (("q/a", "q/d"), 1.0), "q/d": ("q/b", 1.0)})
    with pytest.raises(ConfigError, match="parents"):
        QueryChains({"q/d": (("q/b", "q/b"), 1.0)})


def test_trees_keep_nexus_poisson_fanout_beside_a_diamond():
    chains = QueryChains({**DIAMOND, "t/r": ("t/d", 2.0)}, rng=1)
    (issue,) = chains.issue(0.0, "t/d", np.full(2000, 10.0))
    assert len(issue.parents) == pytest.approx(4000, rel=0.05)
    assert chains.depth("q/d") == 2 and chains.roots["q/d"] == "q/a"


def test_the_simulator_serves_a_diamond_query_one_join_per_frame():
    profiles = {"m": linear_profile("m", 0.0, 2.0, 4)}
    res = simulate_plan(diamond_plan(), profiles, make_policy("early_drop"), rates={"q/a": 20.0}, duration_s=10,
                        arrivals="uniform", seed=3, chains=DIAMOND)
    frames = res.sessions["q/a"].offered
    assert frames == 200 and res.sessions["q/a"].good == frames
    for u in "bcd":
        assert res.sessions[f"q/{u}"].offered == frames and res.sessions[f"q/{u}"].good == frames
    assert not res.bad_queries
