"""``gpuflows simulate fluid``: shipped scenarios run end to end; bad scenarios fail naming the field."""

import json
from pathlib import Path

import pytest
import yaml

from gpu.errors import ConfigError
from gpu.sim.fluid.run import run
from gpuflows.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "scenarios/fluid/toy.yaml"
HYPERBAND = ROOT / "scenarios/fluid/hyperband_8gpu.yaml"


def test_cli_round_trip_writes_the_toy_example_summary(tmp_path):
    out = tmp_path / "toy.json"
    assert main(["simulate", "fluid", str(TOY), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["summary"]["fifo_makespan_s"] == pytest.approx(30.0)
    assert data["summary"]["static_fluid_makespan_s"] == pytest.approx(12.0)
    assert data["summary"]["lower_bound_s"] == pytest.approx(10.0)
    assert data["summary"]["fluid_makespan_s"] == pytest.approx(10.4)  # the worked example: a3 scales out at 10 s


def test_fluid_beats_fifo_on_the_8_gpu_hyperband_scenario():
    report = run(str(HYPERBAND))
    rows = {r["policy"]: r for r in report.table}
    assert rows["fluid"]["makespan_s"] < rows["static_fluid"]["makespan_s"] < rows["fifo"]["makespan_s"]
    assert rows["fluid"]["utilisation"] > rows["fifo"]["utilisation"]
    assert len({r["best_loss"] for r in rows.values()}) == 1  # same configs, same decisions: only timing differs
    # c from the packing curve: each extra packed trial still adds > o_th = 5 % (0.375, 0.167, 0.063), so the
    # largest measured packing, 4, is the limit
    assert report.summary["c"] == report.summary["fitted_c"] == 4


def test_one_policy_can_be_selected():
    report = run(str(TOY), ["fifo"])
    assert [r["policy"] for r in report.table] == ["fifo"] and "speedup_vs_fifo" not in report.summary


def _scenario(tmp_path, base=HYPERBAND, **changes):
    data = yaml.safe_load(base.read_text())
    for dotted, value in changes.items():
        node, *path, last = [data, *dotted.split("__")]
        for key in path:
            node = node[key]
        node[last] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("changes, field", [
    ({"gpus": 0}, "gpus"),
    ({"fluid__c": 0}, "fluid.c"),
    ({"fluid__d": 0}, "fluid.d"),
    ({"algorithm__name": "bayes"}, "algorithm.name"),
    ({"algorithm__space": {}}, "algorithm.space"),
    ({"algorithm__max_budget": 0}, "max_budget"),
    ({"algorithm__sigma": 1}, "algorithm.sigma"),
    ({"workload__alpha": 0.5}, "workload.alpha"),
])
def test_bad_scenario_raises_config_error_naming_the_field(tmp_path, changes, field):
    with pytest.raises(ConfigError) as err:
        run(_scenario(tmp_path, **changes))
    assert err.value.field == field


@pytest.mark.parametrize("base, changes, field, value", [
    (TOY, {"gpus": float("nan")}, "gpus", "nan"),
    (TOY, {"gpus": 0.5}, "gpus", "0.5"),
    (TOY, {"gpus": 10**9}, "gpus", "1000000000"),
    (TOY, {"seed": "abc"}, "seed", "'abc'"),
    (TOY, {"seed": -1}, "seed", "-1"),
    (TOY, {"policies": "fifo"}, "policies", "'fifo'"),
    (TOY, {"fluid": [1, 2]}, "fluid", "[1, 2]"),
    (TOY, {"fluid__o_th": "x"}, "fluid.o_th", "'x'"),
    (TOY, {"fluid__c": 1.5}, "fluid.c", "1.5"),
    (TOY, {"fluid__epsilon": "x"}, "fluid.epsilon", "'x'"),
    (TOY, {"fluid__concurrency": "x"}, "fluid.concurrency", "'x'"),
    (TOY, {"fluid__bogus": 1}, "fluid.bogus", "1"),
    (TOY, {"workload": [1]}, "workload", "[1]"),
    (TOY, {"workload__iter_time_s": "fast"}, "workload.iter_time_s", "'fast'"),
    (TOY, {"workload__iter_time_s": float("inf")}, "workload.iter_time_s", "inf"),
    (TOY, {"workload__beta": float("inf")}, "workload.beta", "inf"),
    (TOY, {"workload__runtime_cv": True}, "workload.runtime_cv", "True"),
    (TOY, {"trials": [5]}, "trials[0]", "5"),
    (TOY, {"trials": [{"id": "a", "budget": 1, "config": [1]}]}, "trials[0].config", "[1]"),
    (TOY, {"trials": [{"id": "a", "budget": 1}, {"id": "a", "budget": 2}]}, "trials[1].id", "'a'"),
    (TOY, {"algorithm": {"name": "grid"}}, "algorithm", "{'name': 'grid'}"),
    (TOY, {"gpu": 5}, "gpu", "5"),
    (HYPERBAND, {"algorithm": "x"}, "algorithm", "'x'"),
    (HYPERBAND, {"workload__packing_curve__ps": "ab"}, "workload.packing_curve.ps", "'ab'"),
    (HYPERBAND, {"workload__packing_curve__ps": [1, 2.5, 3, 4]}, "workload.packing_curve.ps[1]", "2.5"),
    (HYPERBAND, {"workload__packing_curve__throughputs": [0.1, 0.2]}, "workload.packing_curve.throughputs",
     "[0.1, 0.2]"),
])
def test_bad_field_is_one_config_error_naming_field_and_value(tmp_path, base, changes, field, value):
    with pytest.raises(ConfigError) as err:
        run(_scenario(tmp_path, base, **changes))
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}={value}: ")


def test_unknown_policy_is_rejected_by_name():
    with pytest.raises(ConfigError) as err:
        run(str(TOY), ["lifo"])
    assert err.value.field == "policy"


def test_cli_reports_bad_input_instead_of_crashing(tmp_path, capsys):
    assert main(["simulate", "fluid", _scenario(tmp_path, gpus=-2)]) == 2
    assert "gpus" in capsys.readouterr().err
