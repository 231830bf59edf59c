"""Nona in the serving runtime: joins on real workers, per-query routing by the sampled placement, and the
bottleneck link that makes cross-node hand-offs cost (Nona §III): real bytes on a loopback socket, or emulated."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from gpu.devices import discover
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.nona.controller import Query
from tasks.serving.link import EmulatedLink
from tasks.serving.transport import SocketLink, measured_mu, probe_mu
from tasks.serving.loadgen import LoadGenerator, RateTrace
from tasks.serving.models import load_digits_tensors, load_or_train, profile_model
from gpu.schedulers.nexus.profiles import linear_profile
from gpu.schedulers.nona.dag import groupings, subgraphs, undistributed
from tasks.serving.nona import MeasuredNona, replicated_plan, solve_routing, stage_dag
from tasks.serving.runtime import LocalServingRuntime

DIAMOND = {"q/b": ("q/a", 1.0), "q/c": ("q/a", 1.0), "q/d": (("q/b", "q/c"), 1.0)}
INPUTS = {"b": ["a"], "c": ["a"], "d": ["b", "c"]}
MODELS = {u: "digits_mlp" for u in "abcd"}


@pytest.fixture(scope="module")
def served():
    torch.set_num_threads(1)
    data = load_digits_tensors()
    models = {"digits_mlp": load_or_train("digits_mlp", steps=60)}
    profiles = {"digits_mlp": profile_model("digits_mlp", models["digits_mlp"], repeats=5, warmup=2)}
    return data, models, profiles


def diamond_sessions(rate: float = 40.0) -> list[Session]:
    return [Session(f"q/{u}", "digits_mlp", 25.0, rate) for u in "abcd"]


def by_session(outcomes):
    out: dict[str, dict[int, object]] = {}
    for o in outcomes:
        out.setdefault(o.session_id, {})[o.request_id] = o
    return out


def test_a_diamond_query_runs_its_join_once_after_both_branches(served):
    data, models, profiles = served
    with LocalServingRuntime(models, profiles, PoolLedger(discover("2x16GiB", "simulated")), chains=DIAMOND,
                             seed=1) as rt:
        rt.apply(replicated_plan(diamond_sessions(), profiles, nodes=2))
        load = LoadGenerator(rt.frontend.submit, RateTrace.constant({"q/a": 40.0}, 1.0), data.x_test,
                             data.y_test).run()
    by = by_session(rt.recorder.outcomes)
    assert len(by["q/a"]) == load.sent
    on_time = {r for r, o in by["q/a"].items() if o.finish_ms <= o.deadline_ms}
    joins: dict[int, list] = {}
    for o in by["q/d"].values():
        joins.setdefault(rt.chainer.root(o.request_id), []).append(o)
    assert set(joins) <= set(by["q/a"]) and all(len(v) == 1 for v in joins.values())  # once per query
    branches = {u: {rt.chainer.root(r): o for r, o in by[f"q/{u}"].items()} for u in "bc"}

    def both_on_time(margin_ms: float) -> set[int]:
        """Queries both of whose branches finished by their deadline + ``margin_ms`` (dropped ones never did)."""
        return {q for q in set(branches["b"]) & set(branches["c"])
                if all(branches[u][q].finish_ms <= branches[u][q].deadline_ms + margin_ms for u in "bc")}

    # the join runs exactly for the queries whose two branches were on time, however many a loaded machine let
    # through (a branch within 10 µs of its deadline may go either way: the outcome's clock is not the chainer's)
    assert joins and both_on_time(-0.01) <= set(joins) <= both_on_time(0.01) and on_time >= set(joins), len(joins)
    for root, (d,) in joins.items():
        b, c = branches["b"][root], branches["c"][root]
        assert d.arrival_ms == pytest.approx(max(b.finish_ms, c.finish_ms), abs=1e-6)  # after the last branch
        assert d.deadline_ms == pytest.approx(max(b.deadline_ms, c.deadline_ms) + 25.0, abs=1e-6)


def test_each_query_s_requests_land_where_its_sampled_placement_said(served):
    data, models, profiles = served
    dag = stage_dag("q", MODELS, INPUTS, profiles)
    routing = solve_routing({"q": dag}, {"q": 40.0}, [0, 1], mu=1e5)  # a slow link: few queries spread out
    with LocalServingRuntime(models, profiles, PoolLedger(discover("2x16GiB", "simulated")), chains=DIAMOND,
                             query_routing=routing, seed=1) as rt:
        rt.apply(replicated_plan(diamond_sessions(), profiles, nodes=2))
        LoadGenerator(rt.frontend.submit, RateTrace.constant({"q/a": 40.0}, 1.0), data.x_test, data.y_test).run()
    ctl = routing.controller
    outcomes = [o for o in rt.recorder.outcomes if o.node_id >= 0]
    assert {o.session_id for o in outcomes} == {"q/a", "q/b", "q/c", "q/d"}
    for o in outcomes:
        root = rt.chainer.root(o.request_id)
        placement = ctl.on_arrival(0.0, Query(root, "q", (0, 1)))  # the same sample: seeded by the query
        assert o.node_id == placement.server(o.session_id.split("/")[1])
    assert rt.frontend.handoffs == sum(len(INPUTS[o.session_id[2:]]) for o in rt.recorder.outcomes
                                       if o.session_id != "q/a")  # one per edge: the join has two


def test_the_emulated_link_serves_hand_offs_first_come_first_served_at_bytes_over_mu():
    link = EmulatedLink(1e6).start()
    got: list[tuple[str, int]] = []
    t0 = time.perf_counter_ns()
    done = [link.send(t0, 1000, lambda data, k=k: got.append((k, time.perf_counter_ns()))) for k in "xyz"]
    assert [d - t0 for d in done] == [1_000_000, 2_000_000, 3_000_000]  # 1 kB at 1 MB/s: 1 ms each, queued
    link.close()
    assert [k for k, _ in got] == ["x", "y", "z"] and all(t >= d for (_, t), d in zip(got, done))
    assert link.transfers == 3 and link.wait_ns == 3_000_000 and link.busy_ns == 3_000_000
    with pytest.raises(ConfigError, match="link.mu"):
        EmulatedLink(0)


def test_the_socket_link_moves_the_bytes_first_come_first_served_no_faster_than_mu():
    """Real transfers: each hand-off's bytes cross a loopback socket in order, paced by the sender's token bucket
    so that none ends sooner than its bytes at μ after the previous one; the data arrives as sent, and the link
    measures itself (μ from bytes over transfer time, never above the pace)."""
    link = SocketLink(1e6).start()
    got: list[tuple[str, bytes, int]] = []
    t0 = time.perf_counter_ns()
    for k in "xyz":
        link.send(t0, 2000, lambda data, k=k: got.append((k, data, time.perf_counter_ns() - t0)), k.encode() * 300)
    link.close()
    assert [(k, d) for k, d, _ in got] == [(k, k.encode() * 300) for k in "xyz"]
    assert all(t >= (i + 1) * 2_000_000 for i, (*_, t) in enumerate(got))  # 2 kB at 1 MB/s: 2 ms each, queued
    assert link.transfers == 3 and link.bytes == 6000 and link.busy_ns >= 3 * 2_000_000
    assert link.wait_ns > 0  # y and z queued behind x
    assert measured_mu(link.bytes, link.busy_ns) <= 1e6
    assert probe_mu(None, 25_600, count=3) > 0  # an unpaced probe measures loopback itself
    with pytest.raises(ConfigError, match="link.mu"):
        SocketLink(-1.0)


def test_nona_re_solves_for_the_mu_the_socket_link_measured():
    """θ solved for a link that would carry a 25.6 kB hand-off in 0.3 ms splits 3 ms branches; the real link is
    paced at 10 ms a hand-off. The epoch after hand-offs crossed it, MeasuredNona reads the link's μ from their
    bytes and transfer times, finds it beyond ±40 % of the μ θ was solved with, and θ re-solved for it keeps
    the branches together."""
    handoff = 25_600.0
    profiles = {"m": linear_profile("m", 0.0, 3.0, 16)}
    dag = stage_dag("q", {u: "m" for u in "abcd"}, INPUTS, profiles, {f"q/{u}": handoff for u in "bcd"})
    omega = groupings(subgraphs(dag)[0], max_parts=2)
    fast, slow = handoff / 3e-4, handoff / 1e-2
    routing = solve_routing({"q": dag}, {"q": 10.0}, [0, 1], fast)
    before = routing.controller.table.entries[0].thetas["q", "a"]
    link = SocketLink(slow).start()
    nona = MeasuredNona(routing, 2, fast, link=link)
    try:
        for _ in range(3):
            done = []
            link.send(time.perf_counter_ns(), handoff, done.append, b"rows")
            while not done:
                time.sleep(0.005)
        row = nona.on_epoch(1.0, {"q/a": 10}, 1.0, {})
    finally:
        link.close()
    assert 1 - before[undistributed(omega)] > 0.9
    assert row.resolved and row.link_mu <= slow and row.link_mu < 0.5 * fast
    assert 1 - row.thetas["q:a"][undistributed(omega)] < 0.1


def test_a_congested_link_charges_every_cross_node_hand_off_a_join_included(served):
    """Weighted-random shares over two nodes spread a query's stages; with a link of μ = 256 kB/s (1 ms per
    256 B request) every cross-node hand-off queues on it, and the counters show how many crossed."""
    data, models, profiles = served
    with LocalServingRuntime(models, profiles, PoolLedger(discover("2x16GiB", "simulated")), chains=DIAMOND,
                             link_mu=256e3, load_balancer="weighted_random", seed=1) as rt:
        rt.apply(replicated_plan(diamond_sessions(), profiles, nodes=2))
        LoadGenerator(rt.frontend.submit, RateTrace.constant({"q/a": 40.0}, 1.0), data.x_test, data.y_test).run()
    fe = rt.frontend
    by = by_session(rt.recorder.outcomes)
    stage = {u: {rt.chainer.root(r): o for r, o in by[f"q/{u}"].items()} for u in "abcd"}
    edges = crossed = 0  # every parent → child edge of a served child, and those between two nodes
    for u, parents in INPUTS.items():
        for root, child in stage[u].items():
            edges += len(parents)
            crossed += sum(stage[p][root].node_id != child.node_id for p in parents)
    assert fe.handoffs == edges and fe.cross_node == crossed  # a join's earlier parent is charged too
    assert 0.25 * edges < crossed < 0.75 * edges  # weighted random over 2 nodes: about half
    assert rt.link.bytes == 256 * crossed and rt.link.busy_ns >= 1_000_000 * crossed * 0.99
    for u in "bcd":  # a child waiting on the link arrives no sooner than its transfer ends
        for root, child in stage[u].items():
            remote = sum(stage[p][root].node_id != child.node_id for p in INPUTS[u])
            if remote and np.isfinite(child.finish_ms):
                assert child.finish_ms - child.arrival_ms >= remote * 1.0 - 1e-3
    assert np.isfinite(rt.link.utilisation(10**9))
