"""Nona's engine: contraction (§III-D), Ω (§III-C), the PK model and solver, the sampler (§III-A)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from gpu.contract import DecisionPolicy, contract_violations, is_frozen_decision
from gpu.errors import ConfigError
from gpu.schedulers.nona.optimizer import Cluster, LookupTable, NonaModel, QueryClass, solve, solve_table, theta_vector
from gpu.schedulers.nona.baselines import (RandomPlacement, expert_thetas, opportunistic_thetas,
                                           undistributed_thetas)
from gpu.schedulers.nona.dag import (Dag, Subgraph, bottlenecks, branches, contract, contractible_edges,
                                     groupings, subgraphs)
from gpu.schedulers.nona.controller import GroupingSampler, NonaController, Query
from gpu.sim.nona.workloads import motivating_query, paper_models

MOTIVATING = Cluster(servers=2, nu=1000.0, mu=10e9)  # §II: 80 Gbps, ops in ms of compute


def _chain(*names: str) -> dict[tuple[str, str], float]:
    return {(a, b): 1.0 for a, b in zip(names, names[1:])}


# -- DAGs and contraction ---------------------------------------------------------------------------------------
def test_chain_contracts_to_one_task_adding_ops():
    dag = Dag.build("vgg", {"a": 1, "b": 2, "c": 3}, _chain("a", "b", "c"))
    out = contract(dag)
    assert out.dag.tasks == ("a",) and out.dag.ops == (6.0,) and out.members == {"a": ("a", "b", "c")}


def test_edge_whose_contraction_would_add_a_wait_is_kept():
    """Fig. 2a's yellow edge: merging 4 → 5 would make 8 wait for 5."""
    dag = Dag.build("g", dict.fromkeys(["0", "4", "5", "8", "9"], 1.0),
                    {("0", "4"): 1, ("4", "5"): 1, ("4", "8"): 1, ("5", "9"): 1, ("8", "9"): 1})
    assert ("4", "5") not in contractible_edges(dag)
    assert len(contract(dag).dag.tasks) == 4  # only 0 → 4 goes: a diamond 4 → {5, 8} → 9 remains


def test_identity_skip_block_needs_two_rounds_and_vanishes():
    """A residual block x → a → b → add ⟵ x: round 1 merges the chain, round 2 the rest (Fig. 2a's nodes 12–15)."""
    dag = Dag.build("block", dict.fromkeys(["x", "a", "b", "add"], 1.0),
                    {("x", "a"): 5, ("a", "b"): 5, ("b", "add"): 5, ("x", "add"): 7})
    out = contract(dag)
    assert (len(out.dag.tasks), out.rounds) == (1, 2)


def test_parallel_edges_created_by_a_merge_add_their_bytes():
    dag = Dag.build("d", dict.fromkeys(["s", "a", "a2", "b", "z"], 1.0),
                    {("s", "a"): 1, ("a", "a2"): 1, ("s", "b"): 1, ("a2", "z"): 3, ("b", "z"): 1, ("a", "z"): 4})
    out = contract(dag)
    assert out.dag.bytes[("s", "a")] == 1 and out.dag.bytes[("a", "z")] == 7  # a+a2 → z: 3 + 4


def test_resnet18_contracts_71_to_10_as_in_table_2():
    graph = paper_models()["resnet18"]  # the shipped profile: torch.fx's graph, timed on this machine
    out = contract(graph)
    assert (len(graph.tasks), len(out.dag.tasks), out.rounds) == (71, 10, 2)
    assert [len(s.intermediates) for s in subgraphs(out.dag)] == [2, 2, 2]  # three downsampling diamonds
    assert sum(out.dag.ops) == pytest.approx(sum(graph.ops))


def test_sequential_models_contract_to_one_task_and_gpt2_keeps_its_attention_branches():
    models = paper_models()
    assert [len(contract(models[m]).dag.tasks) for m in ("vgg16", "alexnet", "densenet121")] == [1, 1, 1]
    gpt2 = contract(models["gpt2"]).dag
    blocks = [s for s in subgraphs(gpt2) if s.intermediates]
    assert len(blocks) == 12  # one multi-branch block per decoder layer: ln_1, then q ∥ k ∥ v, joined by attention
    for s in blocks:
        q, k, v = (next(t for t in s.intermediates if t.endswith(f"attn_{x}")) for x in "qkv")
        assert set(gpt2.preds[q]) == set(gpt2.preds[k]) == set(gpt2.preds[v])
        assert set(gpt2.succs[q]) == set(gpt2.succs[k]) == set(gpt2.succs[v])
        parts = branches(gpt2, s)  # Opportunistic's parts: ln_1 and attention are serial, q, k, v parallel
        assert len(parts) == 3 and (k,) in parts and (v,) in parts and q in parts[0]


def test_bottlenecks_are_the_nodes_on_every_path():
    dag = contract(motivating_query()).dag
    assert bottlenecks(dag) == ("sum", "add")
    assert subgraphs(dag) == (Subgraph("sum", "add", ("det", "det_sparse")),)


@pytest.mark.parametrize("n, size", [(1, 1), (2, 5), (3, 22), (4, 99), (5, 471)])
def test_omega_sizes_follow_stirling_sums(n, size):
    assert len(groupings(Subgraph("r", "z", tuple("abcde"[:n])))) == size


@pytest.mark.parametrize("ops, edges, field", [
    ({"a": 1, "b": 1}, {("a", "b"): 1, ("b", "a"): 1}, "classes.g.edges"),
    ({"a": 1}, {("a", "ghost"): 1}, "classes.g.edges"),
    ({"a": -1}, {}, "classes.g.tasks.a"),
    ({"a": 1, "b": 1}, {("a", "b"): -3}, "classes.g.edges"),
    ({"a": 1, "b": 1, "c": 1}, {("a", "c"): 1, ("b", "c"): 1}, "classes.g.edges"),
])
def test_bad_dags_are_one_config_error(ops, edges, field):
    with pytest.raises(ConfigError) as err:
        Dag.build("g", ops, edges)
    assert err.value.field == field


# -- the queueing model ------------------------------------------------------------------------------------------
def _motivating_model(rate: float, **cluster) -> NonaModel:
    return NonaModel([QueryClass(contract(motivating_query()).dag, rate)], Cluster(2, 1000.0, 10e9, **cluster))


def test_motivating_example_jcts_with_no_queueing():
    """§II: allocation 1 (det remote) 32 ms, allocation 2 (sparse det remote) 14 ms, undistributed 22 ms."""
    model = _motivating_model(0.0)
    jct = {}
    for i, g in enumerate(model.blocks[0].omega):
        theta = np.eye(len(model.blocks[0].omega))[i]
        jct[(g.parts, g.k, g.l)] = model.predict(theta).jct["f"] * 1000
    together = ((("det", "det_sparse"),), 0, 0)
    assert jct[together] == pytest.approx(22)
    assert jct[((("det",), ("det_sparse",)), 0, 0)] == pytest.approx(14)  # sparse det away, sink with det
    assert jct[((("det",), ("det_sparse",)), 1, 1)] == pytest.approx(32)  # det away, sink with it


def test_nona_distributes_less_as_the_network_gets_busy():
    """Table I's point: light network → distribute (allocation 2) nearly always; busy → mostly not."""
    distributed = []
    for busy in (0.0, 0.3, 0.6, 0.9):
        model = _motivating_model(20.0, bg_comm_rate=busy * 10e9 / 10e6, bg_comm_bytes=10e6)
        theta = solve(model).thetas[("f", "sum")]
        distributed.append(1 - theta[4])
    assert distributed[0] > 0.99 and distributed[-1] < 0.01
    assert all(a >= b - 1e-6 for a, b in zip(distributed, distributed[1:]))


def test_self_induced_congestion_gives_a_mixed_theta_that_keeps_rho_below_one():
    model = _motivating_model(600.0)
    sol = solve(model)
    theta = np.asarray(sol.thetas[("f", "sum")])
    assert 0.2 < theta[0] < 0.8 and theta[0] + theta[4] == pytest.approx(1, abs=1e-4)
    assert sol.prediction.rho < 1
    # never distributing or always distributing is worse than the mix
    assert sol.prediction.objective < model.predict(model.corner()).objective
    assert sol.prediction.objective < model.predict(np.eye(5)[0]).objective


def test_pk_wait_matches_a_lindley_recursion_link():
    """(VIII) against a simulated FIFO link fed by the Poisson transfer streams θ produces."""
    model = _motivating_model(700.0)
    theta = np.array([0.6, 0, 0, 0, 0.4])
    pred = model.predict(theta)
    rng = np.random.default_rng(1)
    n = 400_000
    lam = 700.0 * 0.6 * 2  # two 1 ms transfers per distributed query
    gaps = rng.exponential(1 / lam, n)
    service = np.full(n, 1e-3)
    wait = np.zeros(n)
    for i in range(1, n):  # Lindley: W_{i} = max(0, W_{i-1} + S_{i-1} − A_i)
        wait[i] = max(0.0, wait[i - 1] + service[i - 1] - gaps[i])
    assert pred.rho == pytest.approx(lam * 1e-3)
    assert wait[n // 10:].mean() == pytest.approx(pred.phi, rel=0.05)


def test_gradient_matches_finite_differences():
    classes = [QueryClass(contract(d).dag, 3.0) for d in paper_models().values()]
    model = NonaModel(classes, Cluster(16, 1.0, 1.25e9, bg_comm_rate=100, bg_comm_bytes=1e6))
    theta = np.random.default_rng(0).dirichlet(np.ones(model.offsets[-1]))
    value, grad = model.objective_and_gradient(theta, model.rates(), 1e6)
    for i in (0, 7, 200, len(theta) - 1):
        step = np.zeros_like(theta)
        step[i] = 1e-7
        assert (model.objective_and_gradient(theta + step, model.rates(), 1e6)[0] - value) / 1e-7 == \
            pytest.approx(grad[i], rel=1e-3, abs=1e-9)


def test_every_solved_theta_is_on_its_simplex_with_rho_below_one():
    classes = [QueryClass(contract(d).dag, 40.0) for d in paper_models().values()]
    model = NonaModel(classes, Cluster(80, 1.0, 1.25e9))
    sol = solve(model, starts=2)
    for theta in sol.thetas.values():
        assert min(theta) >= 0 and sum(theta) == pytest.approx(1)
    assert sol.prediction.rho < 1
    assert model.predict(theta_vector(model, sol)).objective == pytest.approx(sol.prediction.objective)


def test_rates_no_theta_can_stabilise_name_classes_rates_and_mu():
    model = _motivating_model(10.0, bg_comm_rate=2000, bg_comm_bytes=10e6)  # background alone: ρ = 2
    with pytest.raises(ConfigError) as err:
        solve(model)
    assert err.value.field == "rates" and "'f': 10.0" in str(err.value) and "μ = 1e+10" in str(err.value)


def test_overloaded_servers_are_a_rates_error_when_compute_queueing_is_modelled():
    model = _motivating_model(200.0, compute_queueing=True)  # 200/s × 22 ms on 2 servers: u = 2.2
    with pytest.raises(ConfigError, match="compute load 2.2"):
        solve(model)


@pytest.mark.parametrize("field, kwargs", [("cluster.mu", {"mu": 0.0}), ("cluster.nu", {"nu": -1.0}),
                                           ("cluster.servers", {"servers": 0})])
def test_bad_cluster_is_one_config_error(field, kwargs):
    with pytest.raises(ConfigError) as err:
        Cluster(**{"servers": 2, "nu": 1.0, "mu": 1.0, **kwargs})
    assert err.value.field == field


def test_negative_rate_is_a_config_error():
    with pytest.raises(ConfigError, match="classes.f.rate"):
        QueryClass(motivating_query(), -1.0)


# -- the sampler, the table and the controller -------------------------------------------------------------------
def _sampler(theta, servers=8, seed=3) -> GroupingSampler:
    return GroupingSampler("nona", {"f": contract(motivating_query()).dag}, {("f", "sum"): theta}, servers, seed)


def test_sampler_frequencies_match_theta():
    theta = (0.5, 0.1, 0.05, 0.05, 0.3)
    sampler = _sampler(theta)
    drawn = [sampler.decide(Query(i, "f", tuple(range(8)))).groupings[0] for i in range(4000)]
    counts = np.bincount(drawn, minlength=5)
    assert stats.chisquare(counts, np.asarray(theta) * 4000).pvalue > 0.001


def test_sampled_placement_follows_its_grouping():
    sampler = _sampler((1.0, 0, 0, 0, 0))
    for i in range(200):
        p = sampler.decide(Query(i, "f", tuple(range(8))))
        assert p.server("det") == p.server("sum") == p.server("add") != p.server("det_sparse")  # k = l = 0
    roots = [sampler.decide(Query(i, "f", tuple(range(8)))).server("sum") for i in range(4000)]
    assert stats.chisquare(np.bincount(roots, minlength=8)).pvalue > 0.001  # roots uniform


def test_same_query_same_placement_and_decisions_are_frozen():
    sampler = _sampler((0.2, 0.2, 0.2, 0.2, 0.2))
    assert isinstance(sampler, DecisionPolicy)
    q = Query(41, "f", (0, 1, 2, 3))
    assert sampler.decide(q) == sampler.decide(q) and is_frozen_decision(sampler.decide(q))


def test_lost_node_resamples_among_live_servers():
    sampler = _sampler((0.5, 0, 0, 0, 0.5), servers=2)
    for i in range(100):
        p = sampler.decide(Query(i, "f", (5,)))  # one server left: no grouping with two parts fits
        assert {s for _, s in p.servers} == {5}


def test_bad_theta_is_a_config_error():
    with pytest.raises(ConfigError, match="theta.f.sum"):
        _sampler((0.5, 0.5, 0.5, 0, 0))


def test_baseline_thetas():
    dags = {"f": contract(motivating_query()).dag}
    assert opportunistic_thetas(dags, 8)[("f", "sum")] == (0.25, 0.25, 0.25, 0.25, 0.0)
    assert undistributed_thetas(dags, 8)[("f", "sum")] == (0.0, 0.0, 0.0, 0.0, 1.0)
    assert expert_thetas(dags, 8, 0.4)[("f", "sum")] == pytest.approx((0.1, 0.1, 0.1, 0.1, 0.6))
    spread = [RandomPlacement(dags, 1).decide(Query(i, "f", tuple(range(80)))).used for i in range(300)]
    assert np.mean(spread) > 3.8  # four tasks on 80 servers: almost always four servers


def test_controller_switches_to_the_nearest_table_entry_and_asks_for_a_resolve():
    model = _motivating_model(100.0)
    table = solve_table(model, [1.0, 6.0])
    assert isinstance(table, LookupTable) and len(table.entries) == 2
    ctrl = NonaController({"f": model.classes[0].dag}, table, servers=2)
    assert contract_violations(ctrl) == []
    low = ctrl.on_arrival(0.0, Query(1, "f", (0, 1)))
    assert is_frozen_decision(low) and low.used == 2  # light load: distribute
    choice = ctrl.on_epoch(10.0, {"f": 620.0})
    assert (choice.entry, choice.resolve) == (1, False)
    assert ctrl.on_epoch(20.0, {"f": 5000.0}).resolve
