"""Cilantro simulator: CLI round trip, resumed runs, scenario validation, the static and microservice kinds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.cilantro import make_policy
from gpu.sim.cilantro import load_ucbs, run, simulate_policy
from gpu.sim.cilantro_scenario import parse_multitenant
from gpuflows.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "scenarios" / "cilantro" / "small.yaml"


def test_cli_round_trip_writes_every_policy_and_headline(tmp_path):
    out = tmp_path / "cilantro.json"
    assert main(["simulate", "cilantro", str(SMALL), "--policy", "resource-fair", "--policy", "cilantro-njc",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["policy"] for r in data["table"]] == ["resource-fair", "cilantro-njc"]
    assert data["summary"]["resource_fair_njc_fairness"] == pytest.approx(1.0)
    assert 0 < data["summary"]["cilantro_njc_social_welfare"] <= 1


def small_config(**overrides):
    raw = {"capacity": 100, "horizon_s": 1200, "max_change": 10, "jobs": [
        {"name": "a", "workload": "craydb0", "slo": 0.95, "utility": "sqrt"},
        {"name": "b", "workload": "craydb1", "slo": 0.9},
        {"name": "c", "workload": "craymltrain", "slo": 400, "utility": "quadratic"}]}
    raw.update(overrides)
    return parse_multitenant(raw)


@pytest.mark.parametrize("name", ["cilantro-njc", "cilantro-sw", "evoalg-ew"])
def test_a_resumed_run_continues_identically(name):
    cfg = small_config()
    loads = cfg.loads(0)
    ucbs = load_ucbs(cfg, loads)
    whole, _ = simulate_policy(cfg, make_policy(name), 0, loads, ucbs, keep_allocations=True)
    first, state = simulate_policy(cfg, make_policy(name), 0, loads, ucbs, stop_round=4, keep_allocations=True)
    state = json.loads(json.dumps(state, default=int))
    second, _ = simulate_policy(cfg, make_policy(name), 0, loads, ucbs, start_round=4, state=state, keep_allocations=True)
    assert first.allocations + second.allocations == whole.allocations
    assert np.allclose(np.concatenate([first.rounds["social_welfare"], second.rounds["social_welfare"]]),
                       whole.rounds["social_welfare"])


def test_online_policies_learn_beyond_the_fair_split():
    cfg = small_config(horizon_s=3600)
    report = run_cfg(cfg, ["resource-fair", "cilantro-ew"])
    assert report["cilantro_ew_egalitarian_welfare"] > report["resource_fair_egalitarian_welfare"]


def run_cfg(cfg, names):
    from gpu.sim.cilantro import simulate_all, summarize

    return summarize(simulate_all(cfg, names), cfg.round_s).summary


@pytest.mark.parametrize("field,raw", [
    ("capacity", {"capacity": -5}),
    ("b.slo", {"jobs": [{"name": "b", "workload": "craydb1"}]}),
    ("workload", {"jobs": [{"name": "b", "workload": "nosuch", "slo": 0.9}]}),
    ("utility", {"jobs": [{"name": "b", "workload": "craydb1", "slo": 0.9, "utility": "cubic"}]}),
    ("learner.kind", {"learner": {"kind": "gp"}}),
    ("max_change", {"max_change": -1}),
])
def test_bad_scenario_fields_are_config_errors_naming_the_field(field, raw):
    base = {"capacity": 100, "jobs": [{"name": "a", "workload": "craydb0", "slo": 0.9}]}
    base.update(raw)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_multitenant(base)


def test_unknown_policy_and_kind_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="policy='fifo'"):
        run(str(SMALL), ["fifo"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: nonsense\n")
    with pytest.raises(ConfigError, match="kind='nonsense'"):
        run(str(bad))


def test_static_scenario_reproduces_fig34():
    report = run(str(ROOT / "scenarios" / "cilantro" / "fig34_static.yaml"))
    assert report.summary["oracle_ew_egalitarian_welfare"] == pytest.approx(0.4)
    assert report.summary["oracle_sw_social_welfare"] == pytest.approx(2 / 3)


def test_microservices_scenario_runs_every_baseline(tmp_path):
    path = tmp_path / "ms.yaml"
    path.write_text("kind: microservices\ncapacity: 160\nrounds: 6\nseeds: [0]\n")
    report = run(str(path))
    assert {r["policy"] for r in report.table} == {"ms-cilantro", "ms-evoalg", "ms-egreedy", "ms-resource-fair"}
    assert all(r["mean_p99_ms"] > 0 for r in report.table)
