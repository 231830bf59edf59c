"""Bad input of every kind ends as one line naming the field and the value, never a traceback or nonsense, and
command lines refuse it before any Prefect flow run starts."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from gpu.errors import ConfigError, excerpt
from gpu.systems import SYSTEMS

ROOT = Path(__file__).resolve().parent.parent


def _loaders():
    """Every scenario loader: the four simulators and the serving spec."""
    from tasks.serving.spec import load_spec

    out = {name: entry.run for name, entry in SYSTEMS.items()}
    return {**out, "serving": load_spec}


LOADERS = _loaders()


def _load(system: str, path: Path):
    return LOADERS[system](str(path)) if system == "serving" else LOADERS[system](str(path), None)


# -- command lines: refused before a flow run ------------------------------------------------------------------
BAD_ARGS = [
    ("flows.allocation_rounds", ["--run-name", "Cilantro"], "run_name"),
    ("flows.allocation_rounds", ["--run-name", "a.b"], "run_name"),
    ("flows.allocation_rounds", ["--run-name", "a_b"], "run_name"),
    ("flows.allocation_rounds", ["--seed", "-1"], "seed"),
    ("flows.allocation_rounds", ["--rounds", "0"], "rounds"),
    ("flows.allocation_rounds", ["--mode", "fork"], "mode"),
    ("flows.allocation_rounds", ["--policy", "nope"], "policy"),
    ("flows.allocation_rounds", ["--capacity", "3"], "capacity"),
    ("flows.allocation_rounds", ["--unit", "0"], "unit"),
    ("flows.allocation_rounds", ["--report-s", "90"], "report_s"),
    ("flows.allocation_rounds", ["--simulated", "1x1B"], "simulated"),
    ("flows.trial_groups", ["--fail-trial", "bogus"], "fail_trial"),
    ("flows.trial_groups", ["--algorithm", "pbt", "--fail-trial", "c0001@0"], "fail_trial"),
    ("flows.trial_groups", ["--seed", "-1"], "seed"),
    ("flows.trial_groups", ["--algorithm", "sgd"], "algorithm"),
    ("flows.trial_groups", ["--trials", "0"], "trials"),
    ("flows.trial_groups", ["--chunk", "0"], "chunk"),
    ("flows.trial_groups", ["--execution", "lifo"], "execution"),
    ("flows.trial_groups", ["--mode", "fork"], "mode"),
    ("flows.trial_groups", ["--alpha", "0.5"], "alpha"),
    ("flows.continuous_retraining", ["--fail-window", "99"], "fail_window"),
    ("flows.continuous_retraining", ["--fail-window", "-1"], "fail_window"),
    ("flows.continuous_retraining", ["--fail-stream", "cam9"], "fail_stream"),
    ("flows.continuous_retraining", ["--seed", "-1"], "seed"),
    ("flows.continuous_retraining", ["--streams", "0"], "streams"),
    ("flows.continuous_retraining", ["--window-s", "0"], "window_s"),
    ("flows.continuous_retraining", ["--policy", "greedy"], "policy"),
    ("flows.continuous_retraining", ["--simulated", "99999999x1TiB"], "simulated"),
    ("flows.pool_demo", ["--steps", "-5"], "steps"),
    ("flows.pool_demo", ["--tasks", "0"], "tasks"),
    ("flows.pool_demo", ["--pool", "a/b"], "pool name"),
    ("flows.pool_demo", ["--simulated", "1x1B"], "simulated"),
    ("flows.demo", ["--seed", "-1"], "seed"),
    ("flows.demo", ["--streams", "0"], "streams"),
    ("flows.demo", ["--simulated", "0x16GiB"], "simulated"),
    ("flows.serving_rollout", ["--duration-s", "-1"], "duration_s"),
    ("flows.serving_rollout", ["--batch-policy", "greedy"], "batch_policy"),
    ("flows.serving_rollout", ["--pool", "a b"], "pool name"),
    ("flows.serving_rollout", ["--simulated", "1x1B"], "simulated"),
    ("gpuflows.cli", ["devices", "--simulate", "99999999x1TiB"], "simulated"),
    # numbers past their bound (gpu.scenario's MAX_*), and a pool of no device
    ("flows.pool_demo", ["--simulated", "0x16GiB"], "simulated"),
    ("flows.pool_demo", ["--tasks", "100000000"], "tasks"),
    ("flows.escher_policies", ["--nodes", "100000"], "nodes"),
    ("flows.escher_policies", ["--gang-timeout-s", "1e30"], "gang_timeout_s"),
    ("flows.escher_policies", ["--words", "1000000000000"], "words"),
    ("flows.gpu_sharing", ["--jobs", "100000000"], "jobs"),
    ("flows.gpu_sharing", ["--gap-s", "1e30"], "gap_s"),
    ("flows.gpu_sharing", ["--median-iterations", "1000000000"], "median_iterations"),
    ("flows.serving_rollout", ["--duration-s", "1e30"], "duration_s"),
    ("flows.serving_rollout", ["--duration-s", "2000000"], "duration_s"),  # 40,000 arrivals a second for 23 days
    ("flows.allocation_rounds", ["--rounds", "100000000"], "rounds"),
    ("flows.allocation_rounds", ["--round-s", "1e30"], "round_s"),
    ("flows.continuous_retraining", ["--streams", "100000000"], "streams"),
    ("flows.continuous_retraining", ["--window-s", "1e30"], "window_s"),
    ("flows.trial_groups", ["--trials", "100000000"], "trials"),
    ("flows.trial_groups", ["--placement", "escher", "--nodes", "100000"], "nodes"),
    ("flows.trial_groups", ["--alpha", "1e30"], "alpha"),
    ("gpuflows.cli", ["demo", "--seed", "-1"], "seed"),
    ("gpuflows.cli", ["pool", "--name", "nope"], "pool"),
]


@pytest.mark.parametrize("module,argv,field", BAD_ARGS, ids=[f"{m.split('.')[-1]} {' '.join(a)}" for m, a, _ in BAD_ARGS])
def test_a_bad_argument_is_one_line_naming_it_before_any_flow_run(state_dir, monkeypatch, capsys, module, argv, field):
    from prefect import Flow

    def no_run(*_, **__):
        raise AssertionError("a flow run started")

    monkeypatch.setattr(Flow, "__call__", no_run)
    try:
        code = importlib.import_module(module).main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert f"{field}=" in err.strip().splitlines()[-1], err


@pytest.mark.parametrize("argv,field", [
    (["-m", "flows.allocation_rounds", "--run-name", "Cilantro_1"], "run_name"),
    (["-m", "flows.trial_groups", "--fail-trial", "bogus"], "fail_trial"),
    (["-m", "gpuflows.cli", "demo", "--seed", "-1"], "seed"),
    (["-m", "gpuflows.cli", "devices", "--simulate", "99999999x1TiB"], "simulated"),
])
def test_the_real_entry_points_exit_2_with_one_line_and_talk_to_no_prefect_server(tmp_path, argv, field):
    """The Prefect API points at a closed port: a flow run (or any API call) would fail with a connection error."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUFLOWS_STATE_DIR": str(tmp_path / "state"),
           "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "error: " in last and f"{field}=" in last, done.stderr


# -- numbers past their bound in scenario files, and names that are no names ----------------------------------
def _set(data: dict, path: str, value) -> None:
    """``data`` with the value at a dotted path replaced (list indices, and mapping keys YAML read as numbers, as
    numbers)."""
    def key(d, k: str):
        return int(k) if isinstance(d, list) or (k.isdigit() and int(k) in d) else k

    *parents, last = path.split(".")
    for k in parents:
        data = data[key(data, k)]
    data[key(data, last)] = value


SCENARIO_HOLES = [  # (system, shipped scenario, dotted path, value, the field the one error names)
    ("cilantro", "cilantro/fig34_static.yaml", "demands.0", 1e30, "demands[0]"),
    ("cilantro", "cilantro/small.yaml", "jobs.0.weight", 1e30, "jobs[0].weight"),
    ("ekya", "ekya/table_2_1.yaml", "gpus", 1e30, "gpus"),
    ("escher", "escher/small.yaml", "tune.poll_s", 1e30, "tune.poll_s"),
    ("escher", "escher/small.yaml", "tune.poll_s", 1e-6, "tune.poll_s"),  # 10^8 polls of a 100 s horizon
    ("escher", "escher/small.yaml", "gang.backoff_s", 1e30, "gang.backoff_s"),
    ("escher", "escher/small.yaml", "affinity.cpus", 1e30, "affinity.cpus"),
    ("fluid", "fluid/toy.yaml", "name", ["toy"], "name"),
    ("fluid", "fluid/toy.yaml", "name", "", "name"),
    ("fluid", "fluid/toy.yaml", "workload.iter_time_s", 1e30, "workload.iter_time_s"),
    ("nexus", "nexus/table2_toy.yaml", "sessions.0.slo_ms", 1e308, "sessions[0].slo_ms"),
    ("nexus", "nexus/table2_toy.yaml", "sessions.0.rate", 1e30, "sessions[0].rate"),
    ("nexus", "nexus/table2_toy.yaml", "models.0.table.4", 1e30, "models[0].table.4"),
    ("nexus", "nexus/table2_toy.yaml", "simulation.duration_s", 1e6, "simulation.duration_s"),  # 1.28e8 requests
    ("nona", "nona/motivating.yaml", "cluster.flops", 1e30, "cluster.flops"),
    ("nona", "nona/motivating.yaml", "simulation.horizon_s", 2e6, "simulation.horizon_s"),  # 1.3e7 queries
    ("orloj", "orloj/small.yaml", "batch_sizes", [1, 2, 1e30], "batch_sizes[2]"),
    ("orloj", "orloj/small.yaml", "cost", {"model": "eq43", "overhead_ms": 1e30}, "cost.overhead_ms"),
    ("salus", "salus/fair_three_jobs.yaml", "name", ["fair"], "name"),
    ("salus", "salus/fair_three_jobs.yaml", "name", "", "name"),
    ("salus", "salus/fair_three_jobs.yaml", "device_mb", 1e30, "device_mb"),
    ("salus", "salus/fair_three_jobs.yaml", "jobs.0.iterations", 1e30, "jobs[0].iterations"),
    ("serving", "serving/digits.yaml", "sessions.0.rate", 1e30, "sessions[0].rate"),
    ("serving", "serving/digits.yaml", "trace.duration_s", 1e30, "trace.duration_s"),
]


@pytest.mark.parametrize("system,scenario,path,value,field", SCENARIO_HOLES,
                         ids=[f"{s} {p}={v!r}" for s, _, p, v, _ in SCENARIO_HOLES])
def test_a_number_past_its_bound_or_a_name_that_is_none_is_one_error_naming_it(tmp_path, system, scenario, path,
                                                                                value, field):
    """The shipped scenario with one value changed: one ConfigError naming the field, before anything runs (an
    unbounded value made the run hang, fill memory or print nonsense; a list as a name was printed as a list)."""
    import yaml

    shipped = ROOT / "scenarios" / scenario
    folder = shutil.copytree(shipped.parent, tmp_path / "scenarios")  # files the scenario names resolve beside it
    data = yaml.safe_load(shipped.read_text())
    _set(data, path, value)
    changed = folder / "changed-scenario.json"
    changed.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}="):
        _load(system, changed)


# -- error messages ---------------------------------------------------------------------------------------------
def _laughs(levels: int = 9, width: int = 9) -> list:
    lol: list = ["lol"] * width
    for _ in range(levels - 1):
        lol = [lol] * width
    return lol


def test_an_error_shows_a_short_excerpt_of_the_value_however_big():
    t0 = time.perf_counter()
    for value in (_laughs(), "x" * 10**7, {str(i): i for i in range(10**5)}, 10**5000):
        msg = str(ConfigError("streams", value, "must be a list of mappings"))
        assert msg.startswith("streams=") and msg.endswith(": must be a list of mappings") and len(msg) < 130, msg
    assert time.perf_counter() - t0 < 2


BILLION_LAUGHS = "\n".join(
    ["# a billion laughs: ten anchors, each a list of 36 aliases of the one before", 'a: &a ["lol", "lol", "lol"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 36)}]" for i in range(10)]
    + ["streams: *k", ""])


@pytest.mark.parametrize("system", sorted(LOADERS))
def test_a_yaml_alias_bomb_fails_fast_in_little_memory(tmp_path, system):
    assert 1500 < len(BILLION_LAUGHS) < 1800
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ConfigError, match=r"aliases expand to more than 1,000,000 values") as exc:
            _load(system, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 5 and peak < 20 * 2**20 and len(str(exc.value)) < 200 + len(str(path))


# -- scenario files ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("system", sorted(LOADERS))
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_deep_nesting_is_refused_naming_the_file_in_every_loader(tmp_path, system, suffix):
    path = tmp_path / f"deep{suffix}"
    path.write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match=rf"scenario={re.escape(excerpt(str(path)))}: .*nested deeper than 32 levels"):
        _load(system, path)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_the_nesting_bound_is_32_levels(tmp_path, suffix):
    from gpu.scenario import load_scenario

    ok, deep = tmp_path / f"ok{suffix}", tmp_path / f"deep{suffix}"
    ok.write_text('{"x": ' + "[" * 31 + "1" + "]" * 31 + "}")  # the top mapping + 31 lists: 32 levels
    deep.write_text('{"x": ' + "[" * 32 + "]" * 32 + "}")
    assert load_scenario(ok)["x"]
    with pytest.raises(ConfigError, match="nested deeper than 32 levels"):
        load_scenario(deep)


def test_aliases_cannot_nest_deeper_or_refer_to_themselves(tmp_path):
    from gpu.scenario import load_scenario

    chained = tmp_path / "chained.yaml"
    chained.write_text("a: &a " + "[" * 20 + "]" * 20 + "\nb: " + "[" * 20 + "*a" + "]" * 20 + "\n")
    with pytest.raises(ConfigError, match="line 2: nested deeper than 32 levels"):
        load_scenario(chained)
    loop = tmp_path / "loop.yaml"
    loop.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match=r"line 1: alias \*a is inside its own anchor"):
        load_scenario(loop)


def test_a_merge_key_may_still_be_overridden(tmp_path):
    from gpu.scenario import load_scenario

    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {slo_ms: 10, rate: 5}\nsession:\n  <<: *base\n  rate: 7\n")
    assert load_scenario(path)["session"] == {"slo_ms": 10, "rate": 7}


@pytest.mark.parametrize("system,field", [("nexus", "sessions[1].id"), ("serving", "sessions[1].id")])
@pytest.mark.parametrize("empty", ['""', "'  '"])
def test_an_empty_nexus_id_is_refused(tmp_path, system, field, empty):
    src = ROOT / ("scenarios/nexus/table2_toy.yaml" if system == "nexus" else "scenarios/serving/digits.yaml")
    text = src.read_text()
    old = "{id: B," if system == "nexus" else "{id: cnn_small,"
    path = tmp_path / "s.yaml"
    path.write_text(text.replace(old, f"{{id: {empty},"))
    with pytest.raises(ConfigError, match=rf"{re.escape(field)}=.*: must not be empty"):
        _load(system, path)


# -- FLUID search spaces ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry,field,why", [
    ({"uniform": [0.1]}, "search_space.lr.uniform", "must be \\[low, high\\]"),
    ({"loguniform": [1e-4, 0.1, 1]}, "search_space.lr.loguniform", "must be \\[low, high\\]"),
    ({"uniform": ["a", "b"]}, "search_space.lr.uniform\\[0\\]", "must be a number"),
    ({"uniform": [0.1, None]}, "search_space.lr.uniform\\[1\\]", "must be a number"),
    ({"grid": [[1], [2]]}, "search_space.lr.grid\\[0\\]", "must be a number, a string"),
    ({"choice": [{"a": 1}]}, "search_space.lr.choice\\[0\\]", "must be a number, a string"),
    ({"grid": "abc"}, "search_space.lr.grid", "must be a non-empty list"),
    ({"normal": [0, 1]}, "search_space.lr", "use exactly one of"),
    ([0.1, 0.2], "search_space.lr", "must be a number, a string"),
])
def test_a_malformed_search_space_entry_is_named(entry, field, why):
    from gpu.schedulers.fluid.tuning import parse_space

    with pytest.raises(ConfigError, match=rf"^{field}=.*: {why}"):
        parse_space({"lr": entry, "batch_size": 64}, "search_space")


def test_a_malformed_search_space_in_a_fluid_scenario_is_one_error_line(tmp_path, capsys):
    from gpuflows.cli import main

    text = (ROOT / "scenarios/fluid/hyperband_8gpu.yaml").read_text()
    raw = __import__("yaml").safe_load(text)
    raw["algorithm"]["space"] = {"lr": {"uniform": [0.1]}}
    path = tmp_path / "fluid.json"
    path.write_text(json.dumps(raw))
    assert main(["simulate", "fluid", str(path)]) == 2
    assert "algorithm.space.lr.uniform=[0.1]: must be [low, high]" in capsys.readouterr().err


# -- simulated devices and run names ----------------------------------------------------------------------------
@pytest.mark.parametrize("spec,why", [
    ("99999999x1TiB", "at most 1024 devices per node"),
    ("1x1B", "device memory must be between 1MiB and 1TiB"),
    ("1x2TiB", "device memory must be between 1MiB and 1TiB"),
    ("9999999999x1GiB", "expected COUNT x MEMORY"),
    ("1x" + "9" * 400 + "GiB", "expected COUNT x MEMORY"),
    ("2x", "expected COUNT x MEMORY"),
])
def test_simulated_devices_are_bounded(spec, why):
    from gpu.devices import parse_simulated

    with pytest.raises(ConfigError, match=rf"^simulated=.*: {why}"):
        parse_simulated(spec)
    assert len(parse_simulated("1024x1MiB").devices) == 1024 and not parse_simulated("0x1TiB").devices  # CPU nodes


@pytest.mark.parametrize("name,ok", [("cilantro", True), ("run-2", True), ("Cilantro", False), ("a.b", False),
                                     ("a_b", False), ("-a", False), ("", False)])
def test_a_cilantro_run_name_must_be_a_valid_prefect_artifact_key(name, ok):
    from prefect.types.names import LOWERCASE_LETTERS_NUMBERS_AND_DASHES_ONLY_REGEX as ARTIFACT_KEY

    import flows.allocation_rounds as ar

    args = dict(rounds=1, round_s=20.0, policy="cilantro-njc", capacity=1.0, unit=0.05, resume=True, run_name=name,
                jobs=None, report_s=5.0, max_change=0.2, trace_step=1, warmup_reports=0, seed=0,
                pool_gpus=1)
    if ok:
        s = ar.settings_from(**args)
        assert re.match(ARTIFACT_KEY, f"cilantro-rounds-{s.run_name}")
    else:
        with pytest.raises(ConfigError, match="run_name=.*lowercase letters, digits and '-'"):
            ar.settings_from(**args)
