"""Nona every epoch of a serving rollout: the controller takes the measured query rates and stage service times,
re-solves θ when they moved beyond ±40 % (Nona §III-A, §IV-D), and the frontend routes the next queries by it;
Nona's baselines route in the same seam."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from gpu.devices import discover
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger
from gpu.schedulers.nexus.profiles import linear_profile
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.nona.dag import groupings, subgraphs, undistributed
from gpu.schedulers.nona.optimizer import solve
from gpu.schedulers.nona.controller import Query
from tasks.serving.dynamic_models import ExitByInput, depth_rows
from tasks.serving.epochs import EpochFeedback
from tasks.serving.models import ARCHITECTURES
from tasks.serving.nona import (BASELINES, MeasuredNona, baseline_routing, replicated_plan, serving_model,
                                solve_routing, stage_dag)
from tasks.serving.runtime import LocalServingRuntime

DIAMOND = {"q/b": ("q/a", 1.0), "q/c": ("q/a", 1.0), "q/d": (("q/b", "q/c"), 1.0)}
INPUTS = {"b": ["a"], "c": ["a"], "d": ["b", "c"]}
MODELS = {"a": "mlp", "b": "deep", "c": "deep", "d": "mlp"}
HANDOFF = 25_600.0  # bytes per hand-off


def diamond(profiles, ops_ms: dict[str, float] | None = None):
    dag = stage_dag("q", MODELS, INPUTS, profiles, {f"q/{u}": HANDOFF for u in "bcd"})
    if ops_ms:
        dag = type(dag).build("q", {**dag.op, **{t: ms / 1e3 for t, ms in ops_ms.items()}}, dag.bytes)
    return dag


def distributed(theta) -> float:
    """θ's mass on groupings that split the diamond's branches over two nodes."""
    return 1.0 - theta[undistributed(groupings(SUBGRAPH, max_parts=2))]


PROFILES = {"mlp": linear_profile("mlp", 0.01, 0.1, 16), "deep": linear_profile("deep", 0.05, 0.25, 16)}
SUBGRAPH = subgraphs(diamond(PROFILES))[0]


def test_a_stage_measured_far_from_its_profile_makes_the_table_stale_until_re_solved():
    mu = HANDOFF / 1e-3  # 1 ms a transfer: with 0.3 ms stages nothing is worth distributing
    routing = solve_routing({"q": diamond(PROFILES)}, {"q": 10.0}, [0, 1], mu)
    ctl = routing.controller
    assert distributed(ctl.table.entries[0].thetas["q", "a"]) < 0.01
    assert not ctl.on_epoch(1.0, {"q": 11.0}, {"q": {"b": 0.00031}}).resolve  # within ±40 %: nothing to do
    choice = ctl.on_epoch(2.0, {"q": 10.0}, {"q": {"b": 0.004, "c": 0.004}})  # the branches became 4 ms
    assert choice.resolve and ctl.dags["q"].op["b"] == 0.004
    assert ctl.on_epoch(3.0, {"q": 10.0}).resolve  # stays asked for until a solution for them comes
    ctl.add_solution(solve(serving_model(ctl.dags, {"q": 10.0}, 2, mu)))
    assert len(ctl.table.entries) == 1 and not ctl.on_epoch(4.0, {"q": 10.0}).resolve
    assert distributed(ctl.table.entries[ctl.entry].thetas["q", "a"]) > 0.9
    spread = {ctl.on_arrival(5.0, Query(i, "q", (0, 1))).used for i in range(50)}
    assert spread == {2}  # the next queries are placed by the new θ
    with pytest.raises(ConfigError) as err:
        ctl.on_epoch(6.0, {"q": 10.0}, {"q": {"zz": 0.001}})
    assert err.value.field == "service_s.q.zz"


def spans(routing, n: int = 200) -> set[int]:
    """How many servers each of ``n`` diamond queries placed by ``routing`` uses."""
    routing.set_hosts({f"q/{u}": [0, 1] for u in "abcd"})
    return {routing.controller.on_arrival(0.0, Query(i, "q", (0, 1))).used for i in range(n)}


@pytest.mark.parametrize("name", BASELINES)
def test_each_nona_baseline_places_the_diamonds_tasks_by_its_rule(name):
    fast = HANDOFF / 1e-6  # 1 µs a transfer: Expert's best mix distributes every query
    used = spans(baseline_routing(name, {"q": diamond(PROFILES)}, [0, 1], 3, {"q": 10.0}, fast))
    if name == "undistributed":
        assert used == {1}
    elif name in ("opportunistic", "expert"):
        assert used == {2}  # every parallel branch on its own server
    else:
        assert used == {1, 2}


def test_expert_keeps_queries_on_one_node_when_the_link_is_slow_and_needs_the_link():
    """Expert's q is the mix the queueing model (§III-B) rates best: 1 ms a transfer costs more than running the
    0.3-ms branches side by side saves, so no query is distributed."""
    assert spans(baseline_routing("expert", {"q": diamond(PROFILES)}, [0, 1], 3, {"q": 10.0}, HANDOFF / 1e-3)) == {1}
    with pytest.raises(ConfigError) as err:
        baseline_routing("expert", {"q": diamond(PROFILES)}, [0, 1], 3, {"q": 10.0})
    assert err.value.field == "link.mu"


def test_the_shipped_diamond_spec_re_solves_theta_after_each_rate_shift():
    """The shipped example's 2-s epochs over its 10-s trace: fed the exact arrivals the rollout offers (its
    trace and seed) through the rollout's ``EpochFeedback``, with stage service times as profiled, Nona re-solves
    θ in the epoch after the rate falls to 0.4× (6 s) and after it doubles (8 s), each for the rate measured."""
    from collections import Counter

    import numpy as np

    from tasks.serving.placement import query_routing
    from tasks.serving.spec import load_spec

    sp = load_spec(str(Path(__file__).resolve().parent.parent / "scenarios" / "serving" / "diamond_nona.yaml"))
    profiles = {"digits_mlp": PROFILES["mlp"], "digits_cnn_small": PROFILES["deep"]}
    nona = MeasuredNona(query_routing(sp, profiles), sp.nodes, sp.link_mu, sp.seed)
    times, who = sp.trace(sp.planned_sessions(profiles), issued=set(sp.chains())).arrivals(sp.seed)
    served = {f"block/{st.name}": [(1, profiles[st.model].latency(1))] for st in sp.queries[0].stages}
    feedback = EpochFeedback(sp.epoch.epoch_s, lambda: served, lambda adopt: None, nona=nona)
    beacon = sp.epoch.beacon_s
    for k in range(1, int(sp.duration_s / beacon)):  # the rollout's beacons, less the trace's last
        window = (times >= (k - 1) * beacon) & (times < k * beacon)
        feedback.on_beacon(k * beacon, Counter(np.asarray(who)[window].tolist()))
    assert [e["t_s"] for e in feedback.nona_epochs] == [2.0, 4.0, 6.0, 8.0]
    resolved = [e for e in feedback.nona_epochs if e["resolved"]]
    assert [e["t_s"] for e in resolved] == [6.0, 8.0]
    assert resolved[0]["rates"]["block"] < 0.6 * sp.queries[0].rate < resolved[1]["rates"]["block"] / 2
    assert len(nona.controller.table.entries) == 3 and nona.controller.entry == 2  # solved for 40, 16, 80 q/s


def _serve(measured: MeasuredNona, models, profiles, mu: float | None, rate_of, inputs_of, seconds: int,
           epoch_s: float = 1.0, measure: bool | str = "cpu"):
    """Serve the diamond on two nodes for ``seconds``, root arrivals paced at ``rate_of(t)`` per second with
    ``inputs_of(t)`` rows, over the runtime's socket link of ``mu``; every epoch the measured arrivals (and with
    ``measure``, the batches' thread CPU times) go to Nona. Returns the cross-node hand-offs per epoch and, once
    the runtime has drained, in all."""
    sessions = [Session(f"q/{u}", MODELS[u], 500.0, 10.0) for u in "abcd"]
    pool = PoolLedger(discover("2x16GiB", "simulated"))
    cross = []
    with LocalServingRuntime(models, profiles, pool, chains=DIAMOND, seed=1, query_routing=measured.routing,
                             link_mu=mu, handoff_bytes={f"q/{u}": HANDOFF for u in "bcd"},
                             measure_batches=measure) as rt:
        rt.apply(replicated_plan(sessions, profiles, nodes=2))
        feedback = EpochFeedback(epoch_s, rt.take_batches, rt.update_policies, nona=measured)
        start, t, i, seen = time.perf_counter(), 0.0, 0, 0
        while t < seconds:
            t += 1.0 / rate_of(t)
            time.sleep(max(0.0, start + t - time.perf_counter()))  # pacing arrivals, as the load generator does
            rt.frontend.submit_many("q/a", inputs_of(t)[i % 100:i % 100 + 1])
            i += 1
            if math.floor(t / epoch_s) > len(feedback.nona_epochs):
                cross.append(rt.frontend.cross_node - seen)
                seen = rt.frontend.cross_node
                feedback.on_beacon(math.floor(t / epoch_s) * epoch_s, rt.take_counts())
    return cross, rt.frontend.cross_node


def _per_request_ms(models, profiles, xs) -> float:
    """Mean thread CPU time per request of ``deep`` serving ``xs`` one by one in a runtime (what epochs measure)."""
    session = Session("cal", "deep", 1000.0, 10.0)
    with LocalServingRuntime(models, profiles, PoolLedger(discover("1x16GiB", "simulated")),
                             measure_batches="cpu") as rt:
        rt.apply(replicated_plan([session], profiles, nodes=1))
        for i in range(len(xs)):
            rt.frontend.submit_many("cal", xs[i:i + 1])
            time.sleep(0.005)  # pacing arrivals: one request at a time
        runs = rt.take_batches()["cal"]
    return float(sum(ms / k for k, ms in runs) / len(runs))


HEAVIER = 40  # the heavy branch's inputs take 40 of the model's wide layers, the light ones 1 (25-30x the CPU time)


@pytest.fixture(scope="module")
def stages():
    """The branch model and its per-request CPU time in a runtime on light (1 layer) and heavy (40) inputs."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    models = {"mlp": ARCHITECTURES["digits_mlp"]().eval(),
              "deep": ExitByInput(layers=HEAVIER).eval().requires_grad_(False)}
    light, heavy = depth_rows(1, 100), depth_rows(HEAVIER, 100, seed=1)
    light_ms = _per_request_ms(models, PROFILES, light[:40])
    heavy_ms = _per_request_ms(models, PROFILES, heavy[:40])
    return models, light, heavy, light_ms, heavy_ms


@pytest.mark.slow
def test_a_heavier_stage_measured_mid_run_makes_nona_distribute_the_branches(stages):
    """The branches' inputs start taking 40 wide layers instead of 1 after 2.5 s, mid-epoch (no configuration
    changes; at an epoch's boundary the first heavy requests could land in the light epoch). The
    rollout measures each stage's thread CPU time per request, so the decision rests on the work, not on how
    often a loaded machine preempts the worker: a transfer is set to the geometric middle of the light and
    heavy branch (about 5× either way from where distributing starts to pay, ℓ = a transfer), Nona keeps every
    query on one node while the branches are light, re-solves once an epoch measures them heavy, and the
    queries after that spread over the socket link."""
    models, light, heavy, light_ms, heavy_ms = stages
    assert heavy_ms > 12 * light_ms  # 40× the wide layers (the embedding and the head are shared)
    transfer_s = math.sqrt(light_ms * heavy_ms) / 1e3
    mu = HANDOFF / transfer_s
    profiles = {"mlp": PROFILES["mlp"], "deep": linear_profile("deep", 0.0, light_ms, 16)}
    routing = solve_routing({"q": diamond(profiles)}, {"q": 8.0}, [0, 1], mu)
    measured = MeasuredNona(routing, 2, mu)
    cross, total = _serve(measured, models, profiles, mu, lambda t: 8.0, lambda t: light if t < 2.5 else heavy, 5)
    epochs = measured.history
    assert len(epochs) == 5 and all(abs(e.rates["q"] - 8.0) < 3.0 for e in epochs)
    assert distributed(epochs[1].thetas["q:a"]) < 0.1 and cross[:2] == [0, 0]  # light: nothing crosses
    # an epoch that measured the branch heavy: over 3x its light work as timed alone before the run (an epoch's
    # own light reading was 3x that once, with two test suites sharing the 2 cores)
    heavier = [e for e in epochs[2:] if e.resolved and e.service_ms.get("q/b", 0.0) > 3 * light_ms]
    assert heavier, [(e.t_s, e.resolved, e.service_ms) for e in epochs]
    assert distributed(heavier[0].thetas["q:a"]) > 0.9
    assert total >= 4  # the queries placed after the re-solve crossed the link


@pytest.mark.slow
def test_a_rate_shift_mid_run_makes_nona_distribute_fewer_queries():
    """Branches profiled at 3 ms behind a link whose transfer costs 2.7 ms: at 8 queries/s Nona spreads the
    branches; after the arrival rate jumps to 60/s (2 s in) the next epoch measures it and θ keeps most queries
    on one node, as the link wait φ now outweighs the gain (Nona §III-B). Only λ is measured here (the stages
    are the cheap digits MLP, their service times the profile's): the rate alone moves θ."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    models = {"mlp": ARCHITECTURES["digits_mlp"]().eval(), "deep": ARCHITECTURES["digits_mlp"]().eval()}
    mu = HANDOFF / 2.7e-3
    profiles = {"mlp": PROFILES["mlp"], "deep": linear_profile("deep", 0.0, 3.0, 16)}
    routing = solve_routing({"q": diamond(profiles)}, {"q": 8.0}, [0, 1], mu)
    measured = MeasuredNona(routing, 2, mu)
    rows = depth_rows(1, 100)
    _serve(measured, models, profiles, None, lambda t: 8.0 if t < 2 else 60.0, lambda t: rows, 4, measure=False)
    epochs = measured.history
    assert abs(epochs[1].rates["q"] - 8.0) < 3 and abs(epochs[2].rates["q"] - 60.0) < 15
    assert epochs[2].resolved and epochs[2].service_ms == {}
    assert distributed(epochs[1].thetas["q:a"]) > 0.9 and distributed(epochs[2].thetas["q:a"]) < 0.6
