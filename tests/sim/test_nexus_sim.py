"""Nexus simulator: CLI round trip, bad-rate behaviour of plans and policies, scenario errors."""

import json
from pathlib import Path

import numpy as np
import pytest

from gpu.systems import make_batch_policy as make_policy
from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session, SquishyPacker
from gpu.schedulers.nexus.profiles import linear_profile
from gpu.schedulers.nexus.synthetic import synthetic_profiles
from gpu.schedulers.nexus.query import Query, QueryStage
from gpu.schedulers.nexus.policies import POLICIES as STRATEGIES
from gpu.sim.nexus.run import (NexusScenario, build_plan, evaluate, fewest_gpus, load, max_load,
                           paper_bad_rate, run, scaled_sessions)
from gpu.sim.nexus.engine import SessionStats, SimResult, arrival_times, simulate_plan
from gpuflows.cli import main

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios" / "nexus"


def test_cli_round_trip_writes_every_policy(tmp_path):
    out = tmp_path / "nexus.json"
    assert main(["simulate", "nexus", str(SCENARIOS / "table2_toy.yaml"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {r["policy"]: r for r in data["table"]}
    assert rows["nexus"]["gpus"] == 2 and rows["nexus"]["bad_rate"] == 0.0
    assert rows["batch_oblivious"]["bad_rate"] > 0.1
    assert data["summary"]["nexus_gpus"] == 2.0


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")))
def test_every_shipped_scenario_runs_nexus(path):
    report = run(str(path), ["nexus"])
    assert report.table[0]["bad_rate"] <= 0.05


def one_gpu(rate, alpha=0.5):
    prof = linear_profile("m", alpha, 50 - 25 * alpha, 64)
    sess = Session("s", "m", 100.0, rate)
    plan = Plan("fixed", "paper", (GpuNode(0, 50.0, (SessionPlacement("s", "m", 100.0, 25, rate, 50.0, 100.0),),
                                           saturated=True),), (sess,))
    return plan, {"m": prof}


def test_early_drop_beats_lazy_drop_under_poisson_load():
    plan, profiles = one_gpu(450)
    early = simulate_plan(plan, profiles, make_policy("early_drop"), duration_s=20, seed=3)
    lazy = simulate_plan(plan, profiles, make_policy("lazy_drop"), duration_s=20, seed=3)
    assert early.bad_rate < 0.05 < 0.3 < lazy.bad_rate


def test_uniform_arrivals_below_capacity_are_all_on_time():
    plan, profiles = one_gpu(400)
    res = simulate_plan(plan, profiles, make_policy("early_drop"), duration_s=10, arrivals="uniform", seed=1)
    assert res.bad_rate == 0.0 and res.total("offered") == pytest.approx(4000, abs=1)


def test_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="policy='magic'"):
        run(str(SCENARIOS / "table2_toy.yaml"), ["magic"])


def write(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return str(p)


def test_unknown_scenario_field_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="sesions"):
        run(write(tmp_path, "sesions: []\n"), None)


def test_scenario_with_unknown_model_names_the_session(tmp_path):
    with pytest.raises(ConfigError, match=r"a\.model='resnet'"):
        run(write(tmp_path, "sessions: [{id: a, model: resnet, slo_ms: 100, rate: 10}]\n"), None)


def test_scenario_with_negative_rate_names_the_session(tmp_path):
    with pytest.raises(ConfigError, match=r"a\.rate=-1"):
        run(write(tmp_path, "sessions: [{id: a, model: vgg16, slo_ms: 100, rate: -1}]\n"), None)


def test_scenario_with_slo_below_batch1_latency_names_the_session(tmp_path):
    with pytest.raises(ConfigError, match=r"a\.slo_ms=5"):
        run(write(tmp_path, "sessions: [{id: a, model: vgg16, slo_ms: 5, rate: 10}]\n"), ["nexus"])


def test_cli_prefix_scenario_merges_variants_only_with_prefix_batching(tmp_path):
    out = tmp_path / "pb.json"
    assert main(["simulate", "nexus", str(SCENARIOS / "prefix_variants.yaml"), "--policy", "nexus",
                 "--policy", "nexus_no_prefix_batching", "--json", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())["table"]}
    assert rows["nexus"]["prefix_batching"] and not rows["nexus_no_prefix_batching"]["prefix_batching"]
    assert rows["nexus"]["bad_rate"] == 0.0
    assert rows["nexus_no_prefix_batching"]["bad_rate"] > 0.1  # six whole models do not fit one GPU


def capped_one_gpu(offered):
    """One GPU serving 500 req/s at batch 25 whose plan promises only 200 req/s and lists the rest unassigned."""
    plan, profiles = one_gpu(200)
    return Plan(plan.strategy, plan.preset, plan.nodes, plan.sessions, (("s", offered - 200.0),)), profiles


def test_unassigned_load_of_a_capped_plan_is_routed_to_its_gpu_and_measured():
    capped, profiles = capped_one_gpu(400)
    res = simulate_plan(capped, profiles, make_policy("early_drop"), rates={"s": 400.0}, duration_s=10,
                        arrivals="uniform", seed=2)
    assert capped.served_fraction("s") == pytest.approx(0.5)  # the promise, kept as information
    assert res.bad_rate < 0.01  # the GPU has room for the unpromised half: the dispatcher serves it


def test_unassigned_load_beyond_the_gpu_is_dropped_by_the_dispatcher():
    capped, profiles = capped_one_gpu(1000)
    res = simulate_plan(capped, profiles, make_policy("early_drop"), rates={"s": 1000.0}, duration_s=10,
                        arrivals="uniform", seed=2)
    assert res.total("good") / 10 == pytest.approx(500, rel=0.05)  # the GPU's capacity, no more
    assert res.total("dropped") / res.total("offered") == pytest.approx(0.5, abs=0.05)


def test_throughput_search_judges_a_capped_plan_by_its_measured_bad_rate_not_its_unassigned_load():
    sessions = (Session("a", "resnet50", 50.0, 100.0), Session("b", "resnet50", 200.0, 100.0))
    sc = NexusScenario("two", "paper", synthetic_profiles(), sessions, (), 1, 2.0, "uniform", 0)
    best = max_load(sc, STRATEGIES["nexus"], 1, iters=6)
    plan, res = evaluate(sc, STRATEGIES["nexus"], best, 1)
    unpromised = sum(r for _, r in plan.unassigned) / sum(s.rate for s in plan.sessions)
    assert unpromised > 0.01 >= res.bad_rate  # the old rule rejected this load; the dispatcher serves it


def test_throughput_search_replans_nexus_at_each_load_within_the_cluster():
    sc = load(str(SCENARIOS / "traffic_query.yaml"))
    low, high = build_plan(sc, STRATEGIES["nexus"], 1.0, 6), build_plan(sc, STRATEGIES["nexus"], 5.0, 6)
    assert low.num_gpus <= 6 and high.num_gpus <= 6
    planned = {p.session_id: 0.0 for n in low.nodes for p in n.placements}
    for n in low.nodes:
        for p in n.placements:
            planned[p.session_id] += p.rate
    assert planned["cam_vgg16"] > 150.0  # spare GPUs at load 1 become headroom (rates × h > 1)
    assert high.unassigned  # load 5 does not fit six GPUs: the capped plan says what it cannot promise


def test_a_declared_model_memory_is_charged_and_a_negative_one_is_named(tmp_path):
    text = ("models: [{name: m, alpha_ms: 1, beta_ms: 1, memory_mb: 64}, {name: resnet50, memory_mb: 2048}]\n"
            "sessions: [{id: s, model: m, slo_ms: 50, rate: 1}]\n")
    sc = load(write(tmp_path, text))
    assert sc.profiles["m"].memory(1) == sc.profiles["m"].memory(64) == 64 * 1024**2
    assert sc.profiles["resnet50"].memory(8) == 2048 * 1024**2
    with pytest.raises(ConfigError, match=r"models\[0\]\.memory_mb=-1"):
        load(write(tmp_path, text.replace("memory_mb: 64", "memory_mb: -1")))


def test_prefix_group_with_unknown_prefix_model_names_it(tmp_path):
    text = ("prefix_groups: [{name: g, prefix: alexnet, suffix: {beta_ms: 0.1}, models: [x, y]}]\n"
            "sessions: [{id: a, model: x, slo_ms: 100, rate: 10}]\n")
    with pytest.raises(ConfigError, match=r"prefix_groups\[0\]\.prefix='alexnet'"):
        run(write(tmp_path, text), ["nexus"])


def test_prefix_group_with_negative_suffix_cost_names_it(tmp_path):
    text = ("prefix_groups: [{name: g, prefix: resnet50, suffix: {beta_ms: -1}, models: [x, y]}]\n"
            "sessions: [{id: a, model: x, slo_ms: 100, rate: 10}]\n")
    with pytest.raises(ConfigError, match=r"prefix_groups\[0\]\.suffix\.beta_ms"):
        run(write(tmp_path, text), ["nexus"])


TRAFFIC = SCENARIOS / "traffic_case_study.yaml"


def test_cli_runs_the_traffic_case_study_on_its_16_gpus(tmp_path):
    out = tmp_path / "traffic.json"
    assert main(["simulate", "nexus", str(TRAFFIC), "--json", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())["table"]}
    assert set(rows) == set(STRATEGIES)
    assert rows["nexus"]["gpus"] <= 16 and rows["nexus"]["query_bad_rate"] <= 0.01
    assert rows["nexus"]["offered_rps"] == pytest.approx(400 * (1 + 1.0 + 0.5), rel=0.03)  # frames × (1 + Σγ)


def test_traffic_dp_gives_ssd_more_of_the_400ms_than_the_even_split():
    sc = load(str(TRAFFIC))
    slo = {n: {s.model: s.slo_ms + sc.preprocess(s.model) for s in scaled_sessions(sc, STRATEGIES[n])[0]}
           for n in ("nexus", "nexus_even_split")}  # stage budgets: GPU budget + overlapped pre-processing
    assert slo["nexus_even_split"] == {"ssd": 200.0, "googlenet": 200.0, "vgg_face": 200.0}
    assert slo["nexus"]["ssd"] > 300.0 and slo["nexus"]["ssd"] + slo["nexus"]["vgg_face"] <= 400.0


def test_batch_oblivious_baseline_splits_a_query_slo_evenly():
    plan = build_plan(load(str(TRAFFIC)), STRATEGIES["batch_oblivious"], gpus=16)
    assert plan.strategy == "batch_oblivious" and plan.num_gpus == 16
    assert {p.session_id: p.slo_ms for n in plan.nodes for p in n.placements} == {  # 200 ms less 10 ms OL
        "traffic/detect": 190.0, "traffic/car": 190.0, "traffic/face": 190.0}


def test_twenty_uniform_streams_deliver_twenty_requests_per_stream_period():
    t = arrival_times(400.0, 2.0, "uniform", np.random.default_rng(0), streams=20)
    counts = np.histogram(t, bins=np.arange(0.0, 2000.0 + 1e-9, 50.0))[0]  # one camera every 50 ms
    assert len(t) == 800 and (counts == 20).all()
    assert np.diff(t).std() > 0.5  # unlike one uniform source, the merged gaps vary


def test_query_streams_must_be_a_positive_integer(tmp_path):
    text = ("queries: [{id: q, slo_ms: 400, rate: 10, streams: 0, stages: [{name: d, model: ssd}]}]\n")
    with pytest.raises(ConfigError, match=r"queries\[0\]\.streams=0"):
        run(write(tmp_path, text), ["nexus"])


def test_a_query_counts_once_and_is_bad_when_any_of_its_stage_requests_is():
    q = Query("q", (QueryStage("d", "ssd"), QueryStage("r", "googlenet", "d", 2.0)), 400.0, 10.0)
    sc = NexusScenario("q", "paper", synthetic_profiles(), (Session("s", "resnet50", 100.0, 10.0),), (q,))
    res = SimResult(10.0, {"q/d": SessionStats(offered=100, good=100), "q/r": SessionStats(offered=200, good=180,
                                                                                          dropped=20),
                           "s": SessionStats(offered=100, good=95, late=5)}, {"q/d": set(range(15))})
    assert paper_bad_rate(sc, res) == pytest.approx((15 + 5) / 200)  # 20 bad recognitions in 15 frames
    assert res.bad_rate == pytest.approx(25 / 400)  # per request, the recognitions outweigh the frames


def test_chained_stage_requests_are_issued_by_finished_parents_with_inherited_slack():
    profiles = {"d": linear_profile("d", 0.0, 10.0, 8), "r": linear_profile("r", 0.0, 5.0, 8)}
    sessions = (Session("q/d", "d", 50.0, 20.0), Session("q/r", "r", 20.0, 60.0))
    node = GpuNode(0, 40.0, (SessionPlacement("q/d", "d", 50.0, 8, 20.0, 10.0, 50.0),
                             SessionPlacement("q/r", "r", 20.0, 8, 60.0, 5.0, 45.0)))
    plan = Plan("fixed", "paper", (node,), sessions)
    res = simulate_plan(plan, profiles, make_policy("early_drop"), duration_s=10, arrivals="uniform", seed=4,
                        chains={"q/r": ("q/d", 3.0)})
    parents, children = res.sessions["q/d"], res.sessions["q/r"]
    assert parents.offered == 200 and parents.good == 200
    assert children.offered == pytest.approx(600, rel=0.1)  # Poisson(3) per finished frame, not drawn at 60/s
    assert children.good == children.offered and not res.bad_queries


def test_a_run_given_a_controller_chains_and_routes_by_it():
    """The simulator asks the controller it is given (the one a flow would drive) for children and routes; a
    second set of chains beside it is ambiguous and refused before anything runs."""
    from gpu.schedulers.nexus.controller import NexusController

    profiles = {"d": linear_profile("d", 0.0, 10.0, 8), "r": linear_profile("r", 0.0, 5.0, 8)}
    sessions = (Session("q/d", "d", 50.0, 20.0), Session("q/r", "r", 20.0, 60.0))
    node = GpuNode(0, 40.0, (SessionPlacement("q/d", "d", 50.0, 8, 20.0, 10.0, 50.0),
                             SessionPlacement("q/r", "r", 20.0, 8, 60.0, 5.0, 45.0)))
    plan = Plan("fixed", "paper", (node,), sessions)
    ctl = NexusController(chains={"q/r": ("q/d", 0.5)}, rng=4)
    res = simulate_plan(plan, profiles, make_policy("early_drop"), duration_s=10, arrivals="uniform", seed=4,
                        controller=ctl)
    twin = NexusController(chains={"q/r": ("q/d", 0.5)}, rng=4)  # the same decisions for 200 on-time frames
    twin.install(plan)
    expected = sum(len(i.parents) for i in twin.chain(0.0, "q/d", np.full(200, 50.0)))
    assert res.sessions["q/d"].good == 200 and res.sessions["q/r"].offered == expected
    assert expected == pytest.approx(100, abs=4 * 10)  # Poisson(0.5) × 200: mean 100, sd 10
    with pytest.raises(ConfigError, match="chains"):
        simulate_plan(plan, profiles, make_policy("early_drop"), controller=ctl, chains={"q/r": ("q/d", 3.0)})


def test_a_dropped_parent_issues_no_children_and_loses_its_query():
    profiles = {"d": linear_profile("d", 0.0, 30.0, 1), "r": linear_profile("r", 0.0, 1.0, 8)}
    sessions = (Session("q/d", "d", 60.0, 100.0), Session("q/r", "r", 20.0, 100.0))
    node = GpuNode(0, 31.0, (SessionPlacement("q/d", "d", 60.0, 1, 100.0, 30.0, 60.0),
                             SessionPlacement("q/r", "r", 20.0, 1, 100.0, 1.0, 31.0)))
    res = simulate_plan(Plan("fixed", "paper", (node,), sessions), profiles, make_policy("early_drop"),
                        duration_s=20, arrivals="uniform", seed=4, chains={"q/r": ("q/d", 1.0)})
    parents, children = res.sessions["q/d"], res.sessions["q/r"]
    assert parents.dropped > 0.5 * parents.offered  # 100 frames/s on a GPU that runs 33 per second
    assert children.offered == pytest.approx(parents.good, rel=0.2)  # Poisson(1) each: ±4 % at 650 parents
    assert len(res.bad_queries["q/d"]) >= parents.dropped


@pytest.mark.parametrize("seed", range(6))
def test_nexus_needs_no_more_gpus_than_the_batch_oblivious_scheduler_both_measured(seed):
    """Squishy packing never needs more GPUs than the batch-oblivious scheduler, judged by measurement for both
    (the batch-oblivious plan breaks worst-case SLOs by construction, so its plan alone says nothing): the fewest
    GPUs on which each measures ≤ 1 % bad."""
    rng = np.random.default_rng(seed)
    profiles = synthetic_profiles()
    models = ["resnet50", "inception", "googlenet", "vgg7"]
    sessions = tuple(Session(f"s{i}", models[rng.integers(4)], float(rng.choice([50, 75, 100, 150, 200])),
                             float(rng.uniform(100, 1500))) for i in range(int(rng.integers(4, 9))))
    sc = NexusScenario("random", "paper", profiles, sessions, (), None, 2.0, "uniform", seed)
    upto = 2 * SquishyPacker(profiles, colocate=False).plan(list(sessions)).num_gpus
    nexus = fewest_gpus(sc, STRATEGIES["nexus"], upto)
    oblivious = fewest_gpus(sc, STRATEGIES["batch_oblivious"], upto)
    assert nexus is not None and oblivious is not None
    assert nexus <= oblivious


GAME = SCENARIOS / "game_case_study.yaml"


def test_cli_runs_the_game_case_study_on_its_16_gpus(tmp_path):
    out = tmp_path / "game.json"
    assert main(["simulate", "nexus", str(GAME), "--policy", "nexus", "--policy",
                 "batch_oblivious_no_prefix_batching", "--json", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())["table"]}
    assert rows["nexus"]["gpus"] == 16 and rows["nexus"]["query_bad_rate"] <= 0.01
    assert rows["nexus"]["offered_rps"] == pytest.approx(15000 * 7, rel=0.01)  # icon + six digits per frame
    assert not rows["batch_oblivious_no_prefix_batching"]["prefix_batching"]


def test_game_frame_rates_are_zipf_09_with_six_digit_requests_per_frame():
    rates = {s.session_id: s.rate for s in load(str(GAME)).sessions}
    icons = np.array([rates[f"icon_g{k:02d}"] for k in range(1, 21)])
    digits = np.array([rates[f"digits_g{k:02d}"] for k in range(1, 21)])
    slope = np.polyfit(np.log(np.arange(1, 21)), np.log(icons), 1)[0]
    assert slope == pytest.approx(-0.9, abs=0.01) and digits == pytest.approx(6 * icons)


@pytest.mark.parametrize("policy,icon_sessions", [("nexus", 1), ("batch_oblivious", 1),
                                                  ("nexus_no_prefix_batching", 20),
                                                  ("batch_oblivious_no_prefix_batching", 20)])
def test_game_icon_variants_merge_into_one_prefix_batched_session_only_with_prefix_batching(policy, icon_sessions):
    sc = load(str(GAME))
    sessions, profiles = scaled_sessions(sc, STRATEGIES[policy])
    icons = [s for s in sessions if s.session_id.startswith("icon")]
    digits = [s for s in sessions if s.session_id.startswith("digits")]
    assert len(icons) == icon_sessions and len(digits) == 20  # the per-game LeNets share no prefix
    assert sum(s.rate for s in icons) == pytest.approx(15000.0, abs=0.5)
    if icon_sessions == 1:
        assert icons[0].session_id == "icon@50" and profiles["icon@50"].max_batch == 128


def test_every_policy_is_listed_in_the_docs_policy_list():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "nexus.md").read_text()
    listed = docs.split("Policies (rows of the report):", 1)[1].split("Columns:", 1)[0]
    assert [n for n in STRATEGIES if f"`{n}`" not in listed] == []


def edited(tmp_path, name, path, value):
    """A shipped scenario with the field at ``path`` (keys and list indices) set to ``value``, as a file."""
    import yaml

    raw = yaml.safe_load((SCENARIOS / name).read_text())
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return write(tmp_path, yaml.safe_dump(raw))


@pytest.mark.parametrize("name,path,value,message", [
    ("table2_toy.yaml", ("simulation", "duration_s"), float("nan"), r"simulation\.duration_s=nan"),
    ("table2_toy.yaml", ("simulation", "duration_s"), float("inf"), r"simulation\.duration_s=inf"),
    ("table2_toy.yaml", ("simulation",), "fast", r"simulation='fast': must be a mapping"),
    ("table2_toy.yaml", ("simulation", "noise"), "false", r"simulation\.noise='false': must be true or false"),
    ("table2_toy.yaml", ("simulation", "seed"), 1.5, r"simulation\.seed=1\.5: must be a whole number"),
    ("table2_toy.yaml", ("simulation", "seed"), "x", r"simulation\.seed='x': must be a number"),
    ("table2_toy.yaml", ("simulation", "epsilon_ms"), "1", r"simulation\.epsilon_ms='1'"),
    ("table2_toy.yaml", ("simulation", "duraton_s"), 5, r"simulation\.duraton_s=5: unknown field"),
    ("table2_toy.yaml", ("models", 0, "table"), {"four": 50}, r"models\[0\]\.table='four': batch sizes"),
    ("table2_toy.yaml", ("models", 0, "table"), [50, 75], r"models\[0\]\.table=\[50, 75\]: must be a mapping"),
    ("table2_toy.yaml", ("models", 0, "table", 0), 40, r"models\[0\]\.table=0: batch sizes"),
    ("table2_toy.yaml", ("models", 0, "table", 4), "50", r"models\[0\]\.table\.4='50': must be a number"),
    ("table2_toy.yaml", ("models",), "A", r"models='A': must be a list"),
    ("table2_toy.yaml", ("models", 0, "name"), ["A"], r"models\[0\]\.name=\['A'\]: must be a name"),
    ("table2_toy.yaml", ("sessions",), "fast", r"sessions='fast': must be a list"),
    ("table2_toy.yaml", ("sessions", 0), 5, r"sessions\[0\]=5: must be a mapping"),
    ("table2_toy.yaml", ("sessions", 0, "rate"), "40", r"sessions\[0\]\.rate='40': must be a number"),
    ("table2_toy.yaml", ("sessions", 0, "slo_ms"), float("inf"), r"sessions\[0\]\.slo_ms=inf"),
    ("table2_toy.yaml", ("sessions", 0, "id"), None, r"sessions\[0\]\.id=None: must be a name"),
    ("table2_toy.yaml", ("sessions", 0, "sla_ms"), 5, r"sessions\[0\]\.sla_ms=5: unknown field"),
    ("table2_toy.yaml", ("sessions", 1, "id"), "A", r"sessions=\['A', 'A', 'C'\]: session and query ids"),
    ("traffic_query.yaml", ("queries", 0, "stages", 1, "gamma"), "two",
     r"queries\[0\]\.stages\[1\]\.gamma='two': must be a number"),
    ("traffic_query.yaml", ("queries", 0, "slo_ms"), "400", r"queries\[0\]\.slo_ms='400': must be a number"),
    ("traffic_query.yaml", ("queries", 0, "rate"), float("nan"), r"queries\[0\]\.rate=nan"),
    ("traffic_query.yaml", ("queries", 0, "stages"), "detect", r"queries\[0\]\.stages='detect': must be a list"),
    ("traffic_query.yaml", ("queries", 0, "stages", 1, "parent"), ["detect"],
     r"queries\[0\]\.stages\[1\]\.parent=\['detect'\]: must be a name"),
    ("prefix_variants.yaml", ("prefix_groups", 0, "suffix"), "fc", r"prefix_groups\[0\]\.suffix='fc': must be a map"),
    ("prefix_variants.yaml", ("prefix_groups", 0, "models"), "icon_a",
     r"prefix_groups\[0\]\.models='icon_a': must be a list of names"),
    ("prefix_variants.yaml", ("prefix_groups", 0, "suffix", "beta"), 1, r"prefix_groups\[0\]\.suffix\.beta=1: unknown"),
])
def test_a_mistyped_scenario_field_is_one_config_error_naming_it(tmp_path, name, path, value, message):
    with pytest.raises(ConfigError, match=message):
        load(edited(tmp_path, name, path, value))


def test_a_json_table_with_text_batch_keys_and_a_boolean_noise_flag_load(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"models": [{"name": "m", "table": {"4": 50, "8": 75}}], "simulation": {"noise": True},
                             "sessions": [{"id": "s", "model": "m", "slo_ms": 200, "rate": 10}]}))
    sc = load(str(p))
    assert sc.profiles["m"].batches == (4, 8) and sc.noise is True


def test_simulator_routes_every_request_to_the_gpu_the_serving_frontend_picks():
    """Both route with ``nexus_routing.balancer`` (DRR): shares 4:2:1 give the same GPU per request in order."""
    from tasks.serving.frontend import Frontend
    from tasks.serving.stats import Recorder

    session = Session("s", "m", 50.0, 70.0)
    nodes = tuple(GpuNode(i, 100.0, (SessionPlacement("s", "m", 50.0, 1, rate, 1.0, 51.0),))
                  for i, rate in enumerate((40.0, 20.0, 10.0)))
    plan = Plan("fixed", "paper", nodes, (session,))
    res = simulate_plan(plan, {"m": linear_profile("m", 0.0, 1.0, 1)}, make_policy("early_drop"), duration_s=1.0,
                        arrivals="uniform", log_batches=True)
    simulated = [b.node for b in sorted(res.batch_log, key=lambda b: b.start_ms)]  # idle GPUs: one batch per arrival

    class Gpu:
        def __init__(self, node: int):
            self.node = node

        def push(self, sid, ids, arrival, deadline, rows):
            routed.extend((i, self.node) for i in np.atleast_1d(ids).tolist())

    routed: list[tuple[int, int]] = []
    front = Frontend(Recorder(), "drr")
    front.set_plan(plan, {i: Gpu(i) for i in range(3)})
    for _ in range(len(simulated)):
        front.submit("s", np.zeros(4, np.float32))
    assert len(simulated) == 70 and simulated == [node for _, node in sorted(routed)]
    assert np.bincount(simulated).tolist() == [40, 20, 10]


def test_drr_is_the_authors_bursting_drr_and_splits_by_share():
    """DRR as the authors' ``GetBackendDeficitRoundRobin``: a visit adds ``share / min share`` to the deficit and
    serves while it is ≥ 1, so a 7.1 % GPU beside a 0.36 % sliver gets ⌊0.071 / 0.0036⌋ = 19 or 20 requests in a
    row (never more than ⌈max / min⌉) and the sliver one at a time; over whole rounds the split is the shares'."""
    from gpu.schedulers.nexus.routing import DeficitRoundRobin

    shares = [0.071] * 14 + [0.0036]
    picks = DeficitRoundRobin(range(15), shares).pick_many(27600)  # 100 rounds of 14 × 19.72 + 1
    runs, start = [], 0
    for i in range(1, len(picks) + 1):
        if i == len(picks) or picks[i] != picks[start]:
            runs.append((int(picks[start]), i - start))
            start = i
    assert max(n for _, n in runs) <= np.ceil(0.071 / 0.0036)
    whole = runs[:-1]  # the last run is cut off by the end of the sample
    assert {n for g, n in whole if g < 14} <= {19, 20} and {n for g, n in whole if g == 14} == {1}
    split = np.bincount(picks, minlength=15) / len(picks)
    assert np.allclose(split, np.array(shares) / sum(shares), rtol=0.01)


def test_the_section_7_2_baselines_route_with_their_own_balancer_nexus_with_drr(monkeypatch):
    """§7.2: Clipper's load balancer / a dispatcher for TF, not Nexus's frontend: weighted random for the
    TF-/Clipper-like strategies; Nexus and every ablation of it (b-o included) route with the runtime's DRR."""
    import gpu.sim.nexus.run as nexus_sim

    baselines = {"batch_oblivious_lazy_drop", "batch_oblivious_fixed_batch"}
    assert {n for n, s in STRATEGIES.items() if s.load_balancer == "weighted_random"} == baselines
    assert all(s.load_balancer == "drr" for n, s in STRATEGIES.items() if n not in baselines)
    seen = []
    real = nexus_sim.simulate_plan

    def spy(*a, **kw):
        seen.append(kw["load_balancer"])
        return real(*a, **{**kw, "duration_s": 0.5})

    monkeypatch.setattr(nexus_sim, "simulate_plan", spy)
    sc = load(str(Path(__file__).parents[2] / "scenarios" / "nexus" / "traffic_case_study.yaml"))
    for name in ("batch_oblivious", "batch_oblivious_lazy_drop"):
        evaluate(sc, STRATEGIES[name], 0.1)
    assert seen == ["drr", "weighted_random"]
