"""Ekya simulator: Table 2.1 end to end, scenario validation and the CLI round trip."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gpu.errors import ConfigError
from gpu.schedulers.ekya.thief import StreamState, thief_schedule
from gpu.sim.ekya.run import run, simulate, simulate_policy
from gpu.sim.ekya.scenario import load, parse_scenario
from gpu.sim.ekya.workloads import generate
from gpuflows.cli import main

ROOT = Path(__file__).resolve().parents[2]
TABLE_2_1 = ROOT / "scenarios" / "ekya" / "table_2_1.yaml"
LARGE = ROOT / "scenarios" / "ekya" / "synthetic_10x4.yaml"


def test_table_2_1_thief_reaches_the_accepted_band_and_beats_uniform():
    report = run(str(TABLE_2_1), ["thief", "uniform_cfg1_50"])
    s = report.summary
    assert 0.66 <= s["thief_mean_accuracy"] <= 0.76  # paper: 73%
    assert 0.54 <= s["uniform_cfg1_50_mean_accuracy"] <= 0.58  # paper: 56%
    assert s["thief_gain_over_best_uniform"] > 0.1


def test_table_2_1_thief_picks_only_cfg2_and_starts_b_first():
    result = simulate_policy(load(TABLE_2_1), "thief")
    picked = {sd.config for _, _, d in result.decisions for sd in d.streams if sd.config}
    assert picked == {"cfg2"}
    _, _, first = result.decisions[0]
    assert first.stream("B").config == "cfg2" and first.stream("A").config is None
    assert result.min_accuracy >= 0.40 and result.below_amin_s == 0


def test_table_2_1_uniform_spends_time_below_a_min():
    result = simulate_policy(load(TABLE_2_1), "uniform_cfg1_50")
    assert result.min_accuracy == pytest.approx(0.375) and result.below_amin_s > 0


def test_thief_beats_every_uniform_baseline_when_gpus_are_contended():
    sc = generate(6, 2, windows=2, seed=3)
    s = simulate(sc).summary
    uniform = [v for k, v in s.items() if k.startswith("uniform_")]
    assert s["thief_mean_accuracy"] > max(uniform)


def test_algorithm_1_cannot_leave_a_fair_share_below_delta_and_start_splits_can():
    """1 GPU over 6 streams x 2 jobs: the fair share 1/12 is below Delta = 0.1, so no job can be a victim."""
    sc = generate(6, 1, windows=2, seed=3)
    first = simulate_policy(sc, "thief").decisions[0][2]
    assert first.allocation() == first.start
    assert simulate_policy(sc, "thief_start_splits").mean_accuracy > simulate_policy(sc, "thief").mean_accuracy


def test_simulated_allocations_never_exceed_the_pool():
    sc = generate(5, 2, windows=2, seed=4)
    for policy in sc.policies + ("fixedres", "fixedconfig_cfg2"):
        assert simulate_policy(sc, policy).peak_gpus <= 2 + 1e-9


def test_same_seed_same_simulation():
    a = simulate(generate(4, 1, windows=2, seed=9), ["thief"]).to_dict()
    b = simulate(generate(4, 1, windows=2, seed=9), ["thief"]).to_dict()
    assert a == b


def test_generated_scenario_round_trips_through_yaml(tmp_path):
    sc = generate(3, 2, windows=2, seed=5)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sc.to_dict()))
    assert load(path) == sc


def _toy() -> dict:
    return yaml.safe_load(TABLE_2_1.read_text())


def test_negative_gpu_count_names_the_field():
    raw = _toy() | {"gpus": -2}
    with pytest.raises(ConfigError, match="gpus=-2"):
        parse_scenario(raw)


def _set(raw: dict, dotted: str, value) -> dict:
    """``raw`` with ``a.0.b`` (list indices as numbers) set to ``value``."""
    *path, last = dotted.split(".")
    node = raw
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return raw


@pytest.mark.parametrize("dotted, value, field, shown", [
    ("window_s", float("nan"), "window_s", "nan"),
    ("gpus", float("nan"), "gpus", "nan"),
    ("gpus", float("inf"), "gpus", "inf"),
    ("inference.full_rate_gpus", float("nan"), "inference.full_rate_gpus", "nan"),
    ("inference.points", [[0, "a"], [1, 1]], "inference.points[0][1]", "'a'"),
    ("inference.points", [[0, 0], [1]], "inference.points[1]", "[1]"),
    ("inference.points", [[0, 0], [0.5, 1], [1, 0.5]], "inference.points", "[[0, 0], [0.5, 1], [1, 0.5]]"),
    ("streams.1.inference", {"points": [[0, 1], [1, 0]]}, "streams[1].inference.points", "[[0, 1], [1, 0]]"),
    ("max_passes", True, "max_passes", "True"),
    ("max_passes", 2.5, "max_passes", "2.5"),
    ("retrain_scaling", True, "retrain_scaling", "True"),
    ("start_splits", "false", "start_splits", "'false'"),
    ("policies", "thief", "policies", "'thief'"),
    ("streams.0.name", [1], "streams[0].name", "[1]"),
    ("streams.0", "A", "streams[0]", "'A'"),
    ("streams.0.windows.0.drfit", 0.1, "streams[0].windows[0].drfit", "0.1"),
    ("streams.0.windows.0.configs.0.gpu_seconds", float("inf"), "streams[0].windows[0].configs[0].gpu_seconds", "inf"),
    ("window", 100, "window", "100"),
])
def test_bad_field_is_one_config_error_naming_field_and_value(dotted, value, field, shown):
    with pytest.raises(ConfigError) as err:
        parse_scenario(_set(_toy(), dotted, value))
    assert err.value.field == field and str(err.value).startswith(f"{field}={shown}: ")


def test_config_without_accuracy_names_the_field():
    raw = _toy()
    del raw["streams"][0]["windows"][0]["configs"][1]["accuracy"]
    with pytest.raises(ConfigError, match=r"streams\[0\]\.windows\[0\]\.configs\[1\]\.accuracy"):
        parse_scenario(raw)


def test_unknown_policy_names_the_field():
    with pytest.raises(ConfigError, match="policy='fastest'"):
        run(str(TABLE_2_1), ["fastest"])


def test_cli_round_trip_writes_the_summary(tmp_path, capsys):
    out = tmp_path / "ekya.json"
    assert main(["simulate", "ekya", str(TABLE_2_1), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["system"] == "ekya"
    assert {"thief_mean_accuracy", "uniform_cfg1_50_mean_accuracy"} <= set(data["summary"])
    assert {row["policy"] for row in data["table"]} >= {"thief", "fixedres", "fixedconfig_cfg2"}
    assert "thief" in capsys.readouterr().out


def test_cli_reports_a_bad_scenario_as_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_toy() | {"gpus": -1}))
    assert main(["simulate", "ekya", str(bad)]) == 2
    assert "gpus=-1" in capsys.readouterr().err


def test_shipped_large_scenario_runs():
    report = run(str(LARGE), ["thief", "uniform_cfg2_50"])
    assert report.summary["thief_mean_accuracy"] > report.summary["uniform_cfg2_50_mean_accuracy"]


def test_thief_is_algorithm_1_and_the_start_split_variant_is_chosen_by_name():
    sc = generate(4, 1, windows=1, seed=0)
    plain, splits = (simulate_policy(sc, name).decisions[0][2] for name in ("thief", "thief_start_splits"))
    assert set(plain.start.values()) == {1 / 8}  # fair share of 1 GPU over 4 inference + 4 retraining jobs
    states = [StreamState(s.name, s.windows[0].start_accuracy, s.windows[0].configs, s.inference) for s in sc.streams]
    assert splits == thief_schedule(states, 1, sc.window_s, replace(sc.params, start_splits=True))
    assert splits.start != plain.start
