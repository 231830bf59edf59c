"""The serving-rollout flow end to end in a Prefect server: profile, plan, roll out, re-plan per epoch,
per-epoch MLflow runs with a plot; Ctrl-C stops it promptly; bad specs fail with one error naming the value."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu.errors import ConfigError
from resource_blocks import GpuPool, MlflowTarget
from tasks.runtime.runners import GpuTaskRunner
from tasks.serving.spec import parse_spec

pytestmark = pytest.mark.usefixtures("prefect_server")


def tiny_spec(**changes) -> dict:
    spec = {
        "name": "tiny",
        "sessions": [{"id": "mlp", "model": "digits_mlp", "slo_ms": 100, "rate": 60},
                     {"id": "cnn", "model": "digits_cnn_small", "slo_ms": 100, "rate": 30}],
        "trace": {"duration_s": 6, "seed": 1, "phases": [{"at_s": 0, "scale": 1.0}, {"at_s": 3, "scale": 4.0}]},
        "epoch": {"epoch_s": 2, "min_epoch_s": 1, "beacon_s": 1, "avg_interval_s": 1},
        "runtime": {"training_steps": 30, "profile_repeats": 3},
    }
    spec.update(changes)
    return spec


def runner(name: str, experiment: str = "serving-test") -> GpuTaskRunner:
    return GpuTaskRunner(pool=GpuPool(name=name, device_backend="simulated"), mode="thread",
                         tracking=MlflowTarget(experiment=experiment))


def test_rollout_logs_every_epoch_with_plan_and_slo_figures(state_dir, table_artifacts):
    from mlflow import MlflowClient

    from flows.serving_rollout import serving_rollout

    pipe = {"id": "pipe", "slo_ms": 100, "rate": 20, "stages": [{"name": "a", "model": "digits_cnn_small"},
                                                                  {"name": "b", "model": "digits_mlp", "parent": "a",
                                                                   "gamma": 2}]}
    result = serving_rollout.with_options(task_runner=runner("rollout"))(tiny_spec(queries=[pipe]))
    assert result["requests"] > 200 and result["slo_attainment"] > 0.5 and result["mlflow_errors"] == []
    # the query is served as a DAG: stage b's requests come from a's finished ones (the trace drives only a)
    assert result["queries"]["pipe"]["queries"] > 50 and result["query_bad_rate"] < 0.2
    assert len(result["epochs"]) >= 3 and result["epochs"][0]["gpus"] >= 1
    assert all(e["end_s"] > e["start_s"] for e in result["epochs"])  # no epoch opened by the trace's last beacon
    assert GpuPool(name="rollout", device_backend="simulated").open_ledger().leases() == []
    client = MlflowClient(MlflowTarget(experiment="serving-test").resolved_uri())
    exp = client.get_experiment_by_name("serving-test")
    parent = result["mlflow_run_id"]
    epochs = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}' and "
                                                     "attributes.run_name LIKE 'epoch-%'")
    assert len(epochs) == len(result["epochs"])
    for run in epochs:
        assert {"gpus", "unassigned_rps", "throughput_rps", "slo_attainment", "bad_rate"} <= set(run.data.metrics)
        assert run.data.metrics["gpus"] <= 2  # planned within the simulated 2-GPU pool
        assert run.data.params["plan"].startswith("gpu")
    paths = [a.path for a in client.list_artifacts(parent, "serving")]
    assert "serving/serving_rollout.png" in paths and "serving/summary.json" in paths
    assert client.get_run(parent).data.metrics["query_bad_rate"] == pytest.approx(result["query_bad_rate"])
    series = client.get_metric_history(parent, "series_offered_rps")
    assert len(series) >= 5
    ui = table_artifacts("serving-rollout-epochs")[0]  # the epochs as the Prefect UI shows them
    assert [r["epoch"] for r in ui] == [e["epoch"] for e in result["epochs"]]
    assert [r["gpus"] for r in ui] == [e["gpus"] for e in result["epochs"]]


def test_a_store_that_cannot_log_is_named_in_the_result_and_the_rollout_still_serves(state_dir, tmp_path):
    from flows.serving_rollout import serving_rollout

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # the store's folder cannot be created
    broken = GpuTaskRunner(pool=GpuPool(name="rollout-broken", device_backend="simulated"), mode="thread",
                           tracking=MlflowTarget(tracking_uri=f"sqlite:///{blocker}/mlflow.db"))
    result = serving_rollout.with_options(task_runner=broken)(tiny_spec(trace={"duration_s": 3, "seed": 1,
                                                                               "phases": [{"at_s": 0}]}))
    assert result["requests"] > 100 and result["slo_attainment"] > 0.5  # served and measured all the same
    assert result["mlflow_run_id"] is None and result["mlflow_errors"]
    assert any("not logged to MLflow" in e or "MLflow run" in e for e in result["mlflow_errors"])


def _leases(pool: str) -> list:
    """The pool's leases, as `gpuflows pool` reads them (an empty list while its ledger is still being created)."""
    from gpu.errors import ConfigError
    from gpu.pool import open_pool

    try:
        ledger = open_pool(pool)
    except ConfigError:
        return []
    try:
        return ledger.leases()
    finally:
        ledger.close()


def test_ctrl_c_stops_a_rollout_releases_every_lease_and_cancels_the_flow(state_dir, tmp_path):
    """`python -m flows.serving_rollout` (the shipped spec, a 60 s horizon) gets SIGINT once its workers serve:
    their leases are back in the pool within seconds, not at the horizon; the flow run ends Cancelled saying why;
    the command exits 130 with one line and no traceback."""
    from prefect.client.orchestration import get_client

    root = Path(__file__).resolve().parent.parent
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "flows.serving_rollout", "--duration-s", "60", "--pool", "ctrl-c",
                                 "--mode", "thread", "--no-tracking"], cwd=root, stdout=stdout, stderr=stderr,
                                env={**os.environ, "PYTHONPATH": str(root), "GPUFLOWS_STATE_DIR": str(state_dir)})
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if any(lease.label.rsplit("-", 2)[-2] == "node" for lease in _leases("ctrl-c")):  # <run name>-node-<i>
                break
            time.sleep(0.2)
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        while _leases("ctrl-c") and time.monotonic() - sent < 30:
            time.sleep(0.1)
        released_s = time.monotonic() - sent
        assert proc.wait(120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _leases("ctrl-c") == [] and released_s < 15  # the horizon was a minute away
    stderr = err.read_text()
    assert "Traceback" not in stderr and "interrupted (SIGINT/Ctrl-C)" in stderr.strip().splitlines()[-1], stderr
    with get_client(sync_client=True) as client:
        [run] = [r for r in client.read_flow_runs() if r.flow_id == client.read_flow_by_name("serving-rollout").id
                 and r.parameters.get("pool") and "ctrl-c" in str(r.parameters["pool"])]
    assert run.state.is_cancelled() and "every lease went back" in run.state.message


def test_slo_below_batch_one_latency_fails_naming_the_session(state_dir):
    from flows.serving_rollout import serving_rollout

    spec = tiny_spec(sessions=[{"id": "mlp", "model": "digits_mlp", "slo_ms": 0.001, "rate": 10}])
    with pytest.raises(ConfigError, match=r"mlp\.slo_ms=0\.001: below what batch 1 of digits_mlp needs"):
        serving_rollout.with_options(task_runner=runner("badslo"))(spec)


def test_unknown_model_fails_before_anything_runs(state_dir):
    from flows.serving_rollout import serving_rollout

    spec = tiny_spec(sessions=[{"id": "x", "model": "resnet50", "slo_ms": 50, "rate": 10}])
    with pytest.raises(ConfigError, match=r"x\.model='resnet50': unknown model"):
        serving_rollout.with_options(task_runner=runner("badmodel"))(spec)


def test_negative_rate_and_unknown_fields_are_named():
    with pytest.raises(ConfigError, match=r"mlp\.rate=-5"):
        parse_spec(tiny_spec(sessions=[{"id": "mlp", "model": "digits_mlp", "slo_ms": 50, "rate": -5}]))
    with pytest.raises(ConfigError, match=r"trace\.phases\[1\]\.scale=-1"):
        parse_spec(tiny_spec(trace={"phases": [{"at_s": 0}, {"at_s": 2, "scale": -1}]}))
    with pytest.raises(ConfigError, match=r"runtime\.batch_policy='fifo'"):
        parse_spec(tiny_spec(runtime={"batch_policy": "fifo"}))


def test_shipped_spec_parses_and_cli_has_help(capsys):
    from flows.serving_rollout import DEFAULT_SPEC, main
    from tasks.serving.spec import load_spec

    spec = load_spec(str(DEFAULT_SPEC))
    assert spec.models == ["digits_cnn", "digits_cnn_small", "digits_mlp"] and spec.queries
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "--duration-s" in out and "default: gpuflows-nexus" in out  # the system's experiment
