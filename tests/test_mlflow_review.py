"""What a reviewer relies on in MLflow: one experiment per system where Ekya's thief and uniform runs compare
side by side (same param keys, ``mean_accuracy``, a readable run name), nested runs that say what they did,
``gpu_share`` but no pretended ``system/gpu_*`` reading on a simulated pool, the ``champion`` alias on each
stream's deployed model, and the runner-overhead benchmark's ratio line."""

from __future__ import annotations

import pytest
from prefect import flow, task

from resource_blocks import GpuPool, MlflowTarget
from tasks.requests import gpu_request
from tasks.runners import GpuTaskRunner, flow_mlflow_run_id

pytestmark = pytest.mark.usefixtures("prefect_server")

TINY = dict(streams=2, windows=2, frames=300, labelled=200, mode="thread")


def _pool(name: str) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="2x16GiB")


@pytest.fixture(scope="module")
def ekya_pair(tmp_path_factory):
    """A thief and a uniform run of the Ekya flow with the default tracking target (one state folder)."""
    from flows.continuous_retraining import continuous_retraining

    state = tmp_path_factory.mktemp("review-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUFLOWS_STATE_DIR", str(state))
        summaries = {p: continuous_retraining(**TINY, policy=p, pool=_pool(f"review-{p}")) for p in ("thief", "uniform")}
        yield summaries, MlflowTarget().resolved_uri()


def test_thief_and_uniform_compare_side_by_side_in_the_ekya_experiment(ekya_pair):
    from mlflow import MlflowClient

    summaries, uri = ekya_pair
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("gpuflows-ekya")
    assert exp is not None, "Ekya's runs belong in the experiment gpuflows-ekya"
    runs = {r.data.params.get("policy"): r for r in client.search_runs(
        [exp.experiment_id], "attributes.status = 'FINISHED'") if "mlflow.parentRunId" not in r.data.tags}
    assert set(runs) == {"thief", "uniform"}
    assert set(runs["thief"].data.params) == set(runs["uniform"].data.params)
    assert {"policy", "streams", "windows", "window_s", "seed", "pool"} <= set(runs["thief"].data.params)
    for policy, run in runs.items():
        assert run.info.run_id == summaries[policy]["mlflow_run_id"]
        assert run.data.metrics["mean_accuracy"] == pytest.approx(summaries[policy]["mean_accuracy"])
        assert run.info.run_name.startswith(f"ekya-{policy}-20")  # ekya-thief-2026-11-24T16:40
        assert "makespan_s" in run.data.metrics


def test_nested_runs_carry_window_and_stream(ekya_pair):
    from mlflow import MlflowClient

    summaries, uri = ekya_pair
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("gpuflows-ekya")
    parent = summaries["thief"]["mlflow_run_id"]
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'", max_results=1000)
    windows = [r for r in children if "window" in r.data.tags and "prefect.task_run_id" not in r.data.tags]
    assert {r.data.tags["window"] for r in windows} == {"0", "1"}
    assert all(f"{s}.config" in r.data.params for r in windows for s in ("cam0", "cam1"))
    tasks = [r for r in children if "prefect.task_run_id" in r.data.tags]
    assert tasks and all(r.info.status == "FINISHED" and r.info.end_time >= r.info.start_time for r in tasks)
    assert all("gpu_share" in r.data.metrics for r in tasks if r.data.params["devices"] != "none")


def test_champion_alias_is_the_newest_deployed_version_per_stream(ekya_pair):
    from mlflow import MlflowClient

    _, uri = ekya_pair
    client = MlflowClient(uri)
    checked = 0
    for stream in ("cam0", "cam1"):
        deployed = [v for v in client.search_model_versions(f"name = 'ekya-{stream}'") if v.tags.get("deployed") == "true"]
        if not deployed:
            continue
        newest = max(deployed, key=lambda v: int(v.version))
        assert client.get_model_version_by_alias(f"ekya-{stream}", "champion").version == newest.version
        checked += 1
    assert checked, "no stream deployed a retrained model"


@gpu_request(gpus=0.5)
@task
def half(i: int) -> int:
    return i


def test_simulated_pool_logs_the_share_held_and_nothing_measured(state_dir):
    from mlflow import MlflowClient

    target = MlflowTarget(experiment="review-sim")

    @flow(task_runner=GpuTaskRunner(pool=_pool("review-sim"), mode="thread", tracking=target))
    def tracked() -> str:
        [f.wait() for f in [half.submit(i) for i in range(6)]]
        return flow_mlflow_run_id()

    parent = tracked()
    client = MlflowClient(target.resolved_uri())
    exp = client.get_experiment_by_name("review-sim")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 6
    for run in children:
        assert run.data.metrics["gpu_share"] == 0.5
        assert not [k for k in run.data.metrics if k.startswith("system/gpu_") or k == "gpu_utilization"]
        assert run.data.params["fraction"] == "0.5" and run.info.status == "FINISHED"
        assert run.info.run_name == "half" and run.data.tags["mlflow.runName"] == "half"
        assert run.info.start_time <= run.info.end_time


def test_measured_gpu_readings_use_mlflow_system_metric_names():
    from tasks.tracking import GPU_MEMORY_METRIC, GPU_UTIL_METRIC, TaskRecord, _task_run

    rec = TaskRecord("t", "id", 1.0, placement={"node": "n", "devices": [0], "fraction": 0.25}, placed_at=2.0,
                     finished_at=3.0, state="COMPLETED", gpu_utilization=40.0, gpu_share=0.25, gpu_memory_mb=512.0)
    metrics = _task_run("parent", rec)["metrics"]
    assert metrics[GPU_UTIL_METRIC] == 40.0 and metrics[GPU_MEMORY_METRIC] == 512.0 and metrics["gpu_share"] == 0.25
    assert GPU_UTIL_METRIC == "system/gpu_0_utilization_percentage"


def test_benchmark_prints_the_thread_mlflow_ratio():
    from benchmarks.runner_overhead import format_table

    r = {"tasks": 200, "thread_tasks_per_s": 100.0, "thread_task_phase_tasks_per_s": 200.0,
         "gpu_thread_tasks_per_s": 80.0, "gpu_thread_task_phase_tasks_per_s": 150.0,
         "gpu_thread_mlflow_tasks_per_s": 70.0, "gpu_thread_mlflow_task_phase_tasks_per_s": 140.0,
         "ledger_pairs_per_s_16_threads": 1.0, "ledger_file_pairs_per_s_16_threads": 1.0, "wall_s": 1.0, "cpus": 2}
    for key in ("gpu_thread", "gpu_thread_mlflow"):
        r[f"{key}_vs_thread_ratio"] = r["thread_tasks_per_s"] / r[f"{key}_tasks_per_s"]
        r[f"{key}_vs_thread_task_phase_ratio"] = (r["thread_task_phase_tasks_per_s"]
                                                   / r[f"{key}_task_phase_tasks_per_s"])
    table = format_table(r)
    assert "thread + MLflow vs ThreadPoolTaskRunner: 1.43x per task (task phase 1.43x), target <= 1.5" in table


def test_task_fields_name_what_a_task_worked_on():
    from tasks.tracking import TaskRecord, _task_run, task_fields

    class Config:
        name = "e5-all-d50"

    fields = task_fields({"stream": "cam0", "window": 1, "config": Config(), "model": object(), "flag": True})
    assert fields == {"stream": "cam0", "window": "1", "config": "e5-all-d50"}
    run = _task_run("parent", TaskRecord("retrain", "id", 1.0, extra=fields))
    assert run["tags"]["stream"] == "cam0" and run["params"]["window"] == "1"
