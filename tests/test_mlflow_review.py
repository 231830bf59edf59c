"""What a reviewer relies on in MLflow: one experiment per system where Ekya's thief and uniform runs compare
side by side (same param keys, ``mean_accuracy``, a readable run name), nested runs that say what they did,
``gpu_share`` but no pretended ``system/gpu_*`` reading on a simulated pool, the ``champion`` alias on each
stream's deployed model, and the runner-overhead benchmark's ratio line."""

from __future__ import annotations

import pytest
from prefect import flow, task

from resource_blocks import MlflowTarget
from tasks.runtime.requests import gpu_request
from tasks.runtime.runners import GpuTaskRunner, flow_mlflow_run_id

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture(scope="module")
def ekya_pair(state_folder, sim_pool, tiny_ekya):
    """A thief and a uniform run of the Ekya flow with the default tracking target (one state folder)."""
    from flows.continuous_retraining import continuous_retraining

    with state_folder("review-state"):
        summaries = {p: continuous_retraining(**tiny_ekya, policy=p, pool=sim_pool(f"review-{p}"))
                     for p in ("thief", "uniform")}
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
        assert "tasks_wall_clock_s" in run.data.metrics and "makespan_s" not in run.data.metrics


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


def test_a_models_second_version_prints_no_already_exists_line_and_real_errors_still_raise(state_dir, capfd):
    """MLflow's ``registered_model_name=`` prints "Registered model ... already exists" for every version after
    the first; ``register_model_version`` creates the name once, links each version to its run, and an invalid
    name is still an error."""
    import mlflow
    import torch
    from mlflow.exceptions import MlflowException

    from tasks.runtime.tracking import ensure_experiment, open_client, register_model_version

    uri = MlflowTarget(experiment="review-registry").resolved_uri()
    client = open_client(uri)
    mlflow.set_tracking_uri(uri)
    runs, versions = [], []
    for _ in range(2):
        with mlflow.start_run(experiment_id=ensure_experiment(client, "review-registry")) as run:
            info = mlflow.pytorch.log_model(torch.nn.Linear(2, 1), name="model", serialization_format="pickle",
                                            pip_requirements=["torch==2.13.0"])
        runs.append(run.info.run_id)
        versions.append(register_model_version(client, "review-linear", info, run.info.run_id))
    assert versions == ["1", "2"]
    assert [client.get_model_version("review-linear", v).run_id for v in versions] == runs
    printed = capfd.readouterr()
    assert "already exists" not in printed.out + printed.err
    with pytest.raises(MlflowException, match="name"):
        register_model_version(client, "", info, runs[-1])


@gpu_request(gpus=0.5)
@task
def half(i: int) -> int:
    return i


def test_simulated_pool_logs_the_share_held_and_nothing_measured(state_dir, sim_pool):
    from mlflow import MlflowClient

    target = MlflowTarget(experiment="review-sim")

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("review-sim"), mode="thread", tracking=target))
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
    from tasks.runtime.tracking import GPU_MEMORY_METRIC, GPU_UTIL_METRIC, TaskRecord, _task_run

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
    headline = next(line for line in format_table(r).splitlines()
                    if line.startswith("thread + MLflow vs ThreadPoolTaskRunner"))
    assert "1.43x (task phase 1.43x)" in headline and "target <= 1.5" in headline
    assert headline.rstrip().endswith("reproduced")  # 1.43 is within the target


def test_task_fields_name_what_a_task_worked_on():
    from tasks.runtime.tracking import TaskRecord, _task_run, task_fields

    class Config:
        name = "e5-all-d50"

    fields = task_fields({"stream": "cam0", "window": 1, "config": Config(), "model": object(), "flag": True})
    assert fields == {"stream": "cam0", "window": "1", "config": "e5-all-d50"}
    run = _task_run("parent", TaskRecord("retrain", "id", 1.0, extra=fields))
    assert run["tags"]["stream"] == "cam0" and run["params"]["window"] == "1"


def test_ekya_task_runs_name_their_stream_and_window(ekya_pair):
    """Ekya's tasks take their stream as ``spec``: the nested run still says which stream and window it served."""
    from mlflow import MlflowClient

    summaries, uri = ekya_pair
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("gpuflows-ekya")
    parent = summaries["thief"]["mlflow_run_id"]
    retrains = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}' and "
                                  "tags.`prefect.task_run_id` != '' and params.config != ''", max_results=1000)
    infers = [r for r in client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'",
                                            max_results=1000) if r.info.run_name.startswith("infer_segment")]
    assert infers and {r.data.tags["stream"] for r in infers} == {"cam0", "cam1"}
    for r in [*retrains, *infers]:
        assert r.info.run_name.endswith(f" {r.data.tags['stream']} w{r.data.tags['window']}"), r.info.run_name


def test_links_open_mlflow_on_its_model_training_view(monkeypatch):
    """MLflow 3's UI opens in its GenAI view (no run table) unless the link asks for the model-training one."""
    from tasks.runtime.flow import MLFLOW_UI_ENV, mlflow_run_url

    monkeypatch.delenv(MLFLOW_UI_ENV, raising=False)  # `make test MLFLOW_PORT=...` sets it

    assert mlflow_run_url("sqlite:///x.db", "2", "abc") == (
        "http://127.0.0.1:5000/#/experiments/2/runs/abc?workflowType=machine_learning")
    assert mlflow_run_url("http://mlflow:5000/", "2", "abc", "artifacts") == (
        "http://mlflow:5000/#/experiments/2/runs/abc/artifacts?workflowType=machine_learning")


def test_the_mlflow_run_link_shows_the_runs_readable_name(ekya_pair):
    """The flow run's ``mlflow-run`` artifact names the MLflow run as its run list does (``ekya-thief-...``)."""
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    summaries, uri = ekya_pair
    run = MlflowClient(uri).get_run(summaries["thief"]["mlflow_run_id"])
    with get_client(sync_client=True) as client:
        (link,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["mlflow-run"]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[run.data.tags["prefect.flow_run_id"]])))
    assert f"[{run.info.run_name}](" in link.data and run.info.run_name.startswith("ekya-thief-20")


def test_the_mlflow_run_page_says_where_the_evidence_is(ekya_pair):
    """MLflow shows a run's Description above its metrics, empty unless written: the flow's run says there which
    Prefect flow run it is (linked, by name), which artifact folders hold its evidence and where to compare."""
    from mlflow import MlflowClient

    from tasks.runtime.tracking import VIEW_ID

    summaries, uri = ekya_pair
    run = MlflowClient(uri).get_run(summaries["uniform"]["mlflow_run_id"])
    note = run.data.tags["mlflow.note.content"]
    assert f"[{run.info.run_name}]({run.data.tags['prefect.flow_run_url']})" in note
    assert "`charts/`" in note and "`tables/`" in note and "`allocations/`" in note
    assert f"viewStateShareKey={VIEW_ID}" in note and "`mean_accuracy`" in note


def test_task_run_name_says_what_the_task_did():
    from tasks.runtime.tracking import task_fields, task_run_name

    class StreamSpec:
        name = "cam1"

    fields = task_fields({"spec": StreamSpec(), "window": 2})
    assert fields == {"stream": "cam1", "window": "2"}
    assert task_run_name("retrain", fields) == "retrain cam1 w2"
    assert task_run_name("run_service", {"round": "3", "job": "db"}) == "run_service r3 db"
    assert task_run_name("train_golden", {}) == "train_golden"


def test_a_nested_run_links_its_prefect_task_run():
    from tasks.runtime.tracking import TaskRecord, _task_run

    run = _task_run("parent", TaskRecord("retrain", "tr-1", 1.0), "http://127.0.0.1:4200")
    assert run["tags"]["prefect.task_run_url"] == "http://127.0.0.1:4200/runs/task-run/tr-1"
    assert "prefect.task_run_url" not in _task_run("parent", TaskRecord("retrain", "tr-1", 1.0))["tags"]


@pytest.mark.slow
def test_pool_demo_command_logs_to_the_pool_experiment(state_dir):
    """``python -m flows.pool_demo`` logs to ``gpuflows-pool`` (its flow's own default), under a readable name."""
    from mlflow import MlflowClient

    from flows.pool_demo import main

    assert main(["--tasks", "2", "--steps", "2", "--mode", "thread", "--pool", "review-pool-demo"]) == 0
    client = MlflowClient(MlflowTarget().resolved_uri())
    exp = client.get_experiment_by_name("gpuflows-pool")
    assert exp is not None and client.get_experiment_by_name("gpuflows") is None
    (run,) = client.search_runs([exp.experiment_id], "tags.`prefect.flow_name` = 'pool-demo'")
    assert run.info.run_name.startswith("pool-2tasks-20") and run.data.params["tasks"] == "2"
