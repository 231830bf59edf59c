"""Cilantro simulator: CLI round trip, resumed runs, scenario validation, the static and microservice kinds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.policies import make_policy
from gpu.sim.cilantro.run import load_ucbs, run, simulate_policy
from gpu.sim.cilantro.scenario import parse_multitenant
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
    from gpu.sim.cilantro.run import simulate_all, summarize

    return summarize(simulate_all(cfg, names), cfg.round_s).summary


@pytest.mark.parametrize("field,raw", [
    ("capacity", {"capacity": -5}),
    ("jobs[0].slo", {"jobs": [{"name": "b", "workload": "craydb1"}]}),
    ("workload", {"jobs": [{"name": "b", "workload": "nosuch", "slo": 0.9}]}),
    ("utility", {"jobs": [{"name": "b", "workload": "craydb1", "slo": 0.9, "utility": "cubic"}]}),
    ("learner.kind", {"learner": {"kind": "gp"}}),
    ("max_change", {"max_change": -1}),
])
def test_bad_scenario_fields_are_config_errors_naming_the_field(field, raw):
    base = {"capacity": 100, "jobs": [{"name": "a", "workload": "craydb0", "slo": 0.9}]}
    base.update(raw)
    with pytest.raises(ConfigError, match=re.escape(field)):
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


JOB = {"name": "a", "workload": "craydb0", "slo": 0.9}


@pytest.mark.parametrize("raw, field, value", [
    ({"capacity": float("nan")}, "capacity", "nan"),
    ({"capacity": 1e9}, "capacity", "1000000000.0"),
    ({"unit": 0.001}, "capacity", "100.0"),
    ({"capacity": 200, "unit": 500}, "unit", "500.0"),
    ({"horizon_s": 1}, "horizon_s", "1.0"),
    ({"horizon_s": 1e12}, "horizon_s", "1000000000000.0"),
    ({"report_s": 1e-9}, "report_s", "1e-09"),
    ({"learner": "ibtree"}, "learner", "'ibtree'"),
    ({"learner": {"kind": "ibtree", "beat": 2}}, "learner.beat", "2"),
    ({"forecaster": {"d": True}}, "forecaster.d", "True"),
    ({"forecaster": {"window": 2.5}}, "forecaster.window", "2.5"),
    ({"forecaster": {"confidence": 1}}, "forecaster.confidence", "1.0"),
    ({"seeds": [True]}, "seeds[0]", "True"),
    ({"seeds": [-1]}, "seeds[0]", "-1"),
    ({"warmup_reports": 2.5}, "warmup_reports", "2.5"),
    ({"jobs": [5]}, "jobs[0]", "5"),
    ({"jobs": [JOB | {"name": ["a"]}]}, "jobs[0].name", "['a']"),
    ({"jobs": [JOB | {"utility": ["x"]}]}, "jobs[0].utility", "['x']"),
    ({"jobs": [JOB | {"workload": ["x"]}]}, "jobs[0].workload", "['x']"),
    ({"jobs": [JOB, JOB]}, "jobs[1].name", "'a'"),
    ({"roster": "paper"}, "jobs", repr([JOB])),
    ({"capacty": 100}, "capacty", "100"),
])
def test_multitenant_field_errors_name_the_field_and_value(raw, field, value):
    base = {"capacity": 100, "jobs": [JOB]}
    with pytest.raises(ConfigError) as err:
        parse_multitenant(base | raw)
    assert err.value.field == field and str(err.value).startswith(f"{field}={value}: ")


@pytest.mark.parametrize("text, field, value", [
    ("kind: static\ncapacity: 1.0e+9\ndemands: [10]", "capacity", "1000000000"),
    ("kind: static\ncapacity: 0.5\ndemands: [10]", "capacity", "0.5"),
    ("kind: static\ncapacity: 60\nunit: 500\ndemands: [10]", "unit", "500"),
    ("kind: static\ncapacity: 60\ndemands: [10]\npolicies: oracle-sw", "policies", "'oracle-sw'"),
    ("kind: multitenant\nroster: paper\npolicies: fifo", "policies", "'fifo'"),
    ("kind: microservices\nseeds: [a]", "seeds[0]", "'a'"),
    ("kind: microservices\nrounds: 0.5", "rounds", "0.5"),
    ("kind: microservices\nrounds: 1.0e+6", "rounds", "1000000"),
    ("kind: microservices\ncapacity: 20", "capacity", "20"),
    ("kind: microservices\npolicies: ms-cilantro", "policies", "'ms-cilantro'"),
])
def test_scenario_kinds_reject_bad_fields_by_name_and_value(tmp_path, text, field, value):
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        run(str(path))
    assert err.value.field == field and str(err.value).startswith(f"{field}={value}: ")
