"""Nona every epoch of a serving rollout: the controller takes the measured query rates and stage service times,
re-solves θ when they moved beyond ±40 % (Nona §III-A, §IV-D), and the frontend routes the next queries by it;
Nona's baselines route in the same seam."""

from __future__ import annotations

import math
import time

import pytest
import torch

from gpu.devices import discover
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger
from gpu.schedulers.nexus.profiles import linear_profile
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.nona.dag import groupings, subgraphs, undistributed
from gpu.schedulers.nona.optimizer import solve
from gpu.schedulers.nona.policy import Query
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


@pytest.mark.parametrize("name", BASELINES)
def test_each_nona_baseline_places_the_diamonds_tasks_by_its_rule(name):
    routing = baseline_routing(name, {"q": diamond(PROFILES)}, [0, 1], seed=3)
    routing.set_hosts({f"q/{u}": [0, 1] for u in "abcd"})
    spans = [routing.controller.on_arrival(0.0, Query(i, "q", (0, 1))).used for i in range(200)]
    if name == "undistributed":
        assert set(spans) == {1}
    elif name == "opportunistic":
        assert set(spans) == {2}  # every parallel branch on its own server
    else:
        assert set(spans) == {1, 2}


def _serve(measured: MeasuredNona, models, profiles, mu: float | None, rate_of, inputs_of, seconds: int,
           epoch_s: float = 1.0, measure: bool = True):
    """Serve the diamond on two nodes for ``seconds``, root arrivals paced at ``rate_of(t)`` per second with
    ``inputs_of(t)`` rows, over an emulated link of ``mu``; every epoch the measured arrivals (and with
    ``measure``, batches) go to Nona. Returns the runtime's cross-node hand-offs per epoch."""
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
    return cross


def _per_request_ms(models, profiles, xs) -> float:
    """Mean forward time per request of ``deep`` serving ``xs`` one by one in a runtime (what epochs measure)."""
    session = Session("cal", "deep", 1000.0, 10.0)
    with LocalServingRuntime(models, profiles, PoolLedger(discover("1x16GiB", "simulated")),
                             measure_batches=True) as rt:
        rt.apply(replicated_plan([session], profiles, nodes=1))
        for i in range(len(xs)):
            rt.frontend.submit_many("cal", xs[i:i + 1])
            time.sleep(0.02)  # pacing arrivals: one request at a time
        runs = rt.take_batches()["cal"]
    return float(sum(ms / k for k, ms in runs) / len(runs))


@pytest.fixture(scope="module")
def stages():
    """The branch model (24 wide layers) and its per-request time in a runtime on light and heavy inputs."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    models = {"mlp": ARCHITECTURES["digits_mlp"]().eval(), "deep": ExitByInput(layers=24).eval().requires_grad_(False)}
    light, heavy = depth_rows(1, 100), depth_rows(24, 100, seed=1)
    light_ms = _per_request_ms(models, PROFILES, light[:20])
    heavy_ms = _per_request_ms(models, PROFILES, heavy[:20])
    return models, light, heavy, light_ms, heavy_ms


@pytest.mark.slow
def test_a_heavier_stage_measured_mid_run_makes_nona_distribute_the_branches(stages):
    """The branches' inputs start taking all 24 layers instead of 1 after 2 s (no configuration changes): the
    next epoch measures them slower than a transfer, Nona re-solves, and the next queries spread."""
    models, light, heavy, light_ms, heavy_ms = stages
    assert heavy_ms > 6 * light_ms
    # a transfer costs well over a light branch (contention inflates the light one most), well under a heavy one
    mu = HANDOFF / (heavy_ms / 2.5 / 1e3)
    profiles = {"mlp": PROFILES["mlp"], "deep": linear_profile("deep", 0.0, light_ms, 16)}
    routing = solve_routing({"q": diamond(profiles)}, {"q": 8.0}, [0, 1], mu)
    measured = MeasuredNona(routing, 2, mu)
    cross = _serve(measured, models, profiles, mu, lambda t: 8.0, lambda t: light if t < 2 else heavy, 4)
    epochs = measured.history
    assert len(epochs) == 4 and all(abs(e.rates["q"] - 8.0) < 3.0 for e in epochs)
    before, after = epochs[1], epochs[2]
    assert distributed(before.thetas["q:a"]) < 0.1
    assert after.resolved and after.service_ms["q/b"] > 3 * before.service_ms["q/b"]
    assert distributed(after.thetas["q:a"]) > 0.5
    assert cross[3] > 3 * max(1, cross[1])  # the queries after the re-solve crossed the link


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
