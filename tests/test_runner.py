"""The local GPU task runner inside real Prefect flows: placement, release in every final state,
per-task and per-call requests, MLflow records, and the Prefect internals it relies on."""

from __future__ import annotations

import os
import pickle
import threading

import pytest
from prefect import flow, task
from prefect.states import StateType

from gpu.errors import NeverFitsError
from gpu.placement import ResourceRequest
from resource_blocks import GpuPool, MlflowTarget
from tasks.runtime.requests import current_placement, gpu_options, gpu_request
from tasks.runtime.runners import GpuTaskRunner, flow_mlflow_run_id

pytestmark = pytest.mark.usefixtures("prefect_server")


@gpu_request(gpus=0.5)
@task
def where_am_i(i: int) -> dict:
    import torch

    p = current_placement()
    x = torch.ones(64, 64)
    return {"i": i, "devices": p.gpu_indices, "fraction": p.fraction, "device": p.device,
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "sum": float((x @ x).sum())}


@gpu_request(gpus=0.5)
@task
def retrain_stream(stream: str, window: int) -> str:
    return f"{stream}@{window}"


@task
def fails() -> None:
    raise RuntimeError("task failed on purpose")


def test_process_mode_places_tasks_and_sets_cuda_visible_devices(state_dir, sim_pool):
    runner = GpuTaskRunner(pool=sim_pool("proc"), tracking=False)

    @flow(task_runner=runner)
    def placed_flow():
        futures = [where_am_i.submit(i) for i in range(3)]
        with gpu_options(gpus=1):
            futures.append(where_am_i.submit(3))
        return [f.result() for f in futures]

    results = placed_flow()
    assert [r["fraction"] for r in results] == [0.5, 0.5, 0.5, 1.0]
    for r in results:
        assert r["cvd"] == ",".join(map(str, r["devices"])) and r["device"] == "cpu"
        assert r["sum"] == 64 * 64 * 64
    assert GpuPool(name="proc", device_backend="simulated").open_ledger().leases() == []


def test_failed_task_releases_its_slice_and_the_flow_sees_failure(state_dir, sim_pool):
    @flow(task_runner=GpuTaskRunner(pool=sim_pool("fail", "1x16GiB"), mode="thread", tracking=False))
    def failing_flow():
        with gpu_options(gpus=1):
            bad = fails.submit()
            bad.wait()
            after = where_am_i.submit(0)  # needs the same whole GPU: only possible if released
        return bad.state, after.result()

    state, after = failing_flow()
    assert state.type == StateType.FAILED
    assert after["devices"] == (0,)
    assert sim_pool("fail", "1x16GiB").open_ledger().leases() == []


def test_cancelled_waiting_task_never_leaks_a_slice(state_dir, sim_pool):
    release = threading.Event()

    @gpu_request(gpus=1)
    @task
    def holder() -> None:
        release.wait(30)  # holds the GPU until the test lets go

    runner = GpuTaskRunner(pool=sim_pool("cancel", "1x16GiB"), mode="thread", tracking=False)

    @flow(task_runner=runner)
    def cancel_flow():
        from prefect.context import FlowRunContext

        held = holder.submit()
        waiting = holder.submit()
        FlowRunContext.get().task_runner.cancel_all()   # what Prefect calls on flow cancellation
        release.set()
        held.wait()
        waiting.wait()
        return held.state, waiting.state

    held, waiting = cancel_flow()
    assert held.is_final()
    assert waiting.type == StateType.CANCELLED
    assert sim_pool("cancel", "1x16GiB").open_ledger().leases() == []


def test_never_fitting_request_fails_at_submit_with_the_pool_totals(state_dir, sim_pool):
    @flow(task_runner=GpuTaskRunner(pool=sim_pool("nofit"), mode="thread", tracking=False))
    def too_big():
        with gpu_options(gpus=3):
            where_am_i.submit(0)

    with pytest.raises(NeverFitsError, match=r"where_am_i\(gpus=3.*2 GPU\(s\) of 16GiB"):
        too_big()


def test_killed_worker_process_crashes_the_task_and_frees_its_slice(state_dir, sim_pool):
    @gpu_request(gpus=1)
    @task
    def dies() -> None:
        os.kill(os.getpid(), 9)

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("kill", "1x16GiB"), tracking=False))
    def kill_flow():
        crashed = dies.submit()
        crashed.wait()
        return crashed.state, where_am_i.submit(0).result()

    state, after = kill_flow()
    assert state.type == StateType.CRASHED
    assert after["devices"] == (0,)


def test_each_task_is_a_nested_mlflow_run_with_its_placement(state_dir, sim_pool):
    from mlflow import MlflowClient

    target = MlflowTarget(experiment="runner-test")

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("mlflow"), mode="thread", tracking=target))
    def tracked_flow():
        parent = flow_mlflow_run_id()
        [f.wait() for f in [where_am_i.submit(i) for i in range(3)]]
        retrain_stream.submit("cam3", 2).wait()
        return parent

    parent = tracked_flow()
    client = MlflowClient(target.resolved_uri())
    exp = client.get_experiment_by_name("runner-test")
    assert exp.artifact_location.startswith("file://" + str(state_dir))
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 4
    retrain = [r for r in children if r.data.tags.get("stream") == "cam3"]
    assert len(retrain) == 1 and retrain[0].data.tags["window"] == "2"  # what the task worked on, to filter by
    for run in children:
        assert run.data.params["fraction"] == "0.5" and run.data.params["devices"] in ("0", "1")
        assert {"wait_time_s", "run_time_s", "gpu_share"} <= set(run.data.metrics)
        assert run.info.status == "FINISHED"
    artifacts = [a.path for a in client.list_artifacts(parent, "allocations")]
    assert "allocations/timeline.json" in artifacts and "allocations/timeline.png" in artifacts


def test_runner_is_a_configuration_value(sim_pool):
    runner = GpuTaskRunner(pool=sim_pool("cfg"), mode="thread", default_request={"gpus": 0.25})
    assert runner.duplicate() == runner
    assert pickle.loads(pickle.dumps(runner)) == runner
    assert runner != GpuTaskRunner(pool=sim_pool("cfg"), mode="process")
    with pytest.raises(RuntimeError, match="not started"):
        runner.submit(where_am_i, {"i": 0})
    with pytest.raises(ValueError, match="mode='gpu'"):
        GpuTaskRunner(mode="gpu")


def test_request_precedence_default_then_task_then_block():
    from tasks.runtime.requests import resolve_request

    @task
    def plain():
        pass

    assert resolve_request(plain, {"gpus": 0.25}).gpus == 0.25
    assert resolve_request(where_am_i, {"gpus": 0.25}).gpus == 0.5
    with gpu_options(gpus=1, memory="2GiB"):
        with gpu_options(gpus=2):
            r = resolve_request(where_am_i.with_options(name="renamed"))
    assert (r.gpus, r.memory, r.label) == (2.0, 2 * 2**30, "renamed")
    assert r == ResourceRequest(gpus=2, memory=2 * 2**30, label="renamed")
    with gpu_options(devices=[1]):
        assert resolve_request(where_am_i).devices == (1,)
