"""Prefect's own task-runner behaviours, kept by the local GPU runner in both modes: upstream failures,
``allow_failure``, Prefect's engine errors, tasks the flow never waits for; and what a process worker starts with
(its MPS compute share). Each is what Prefect's ``ThreadPoolTaskRunner`` does for the same flow."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.states import StateType
from prefect.utilities.annotations import allow_failure

from tasks.runtime.requests import current_placement, gpu_options, gpu_request
from tasks.runtime.runners import GpuTaskRunner
from tasks.runtime.slices import MPS_PIPE_ENV, MPS_THREADS_ENV
from tests.polling import final_task_run_state

pytestmark = pytest.mark.usefixtures("prefect_server")


@gpu_request(gpus=0.5)
@task
def fails() -> None:
    raise RuntimeError("upstream failed on purpose")


@gpu_request(gpus=0.5)
@task
def after_an_upstream(x: object = None) -> dict:
    p = current_placement()
    return {"fraction": p.fraction if p else None, "x": type(x).__name__}


@task
def share() -> dict:
    """What a worker process runs under: its pid and MPS thread percentage."""
    return {"pid": os.getpid(), "mps": os.environ.get(MPS_THREADS_ENV), "fraction": current_placement().fraction}


def api_state(task_run_id):
    with get_client(sync_client=True) as client:
        return client.read_task_run(task_run_id).state


@pytest.fixture(scope="module")
def process_run(tmp_path_factory, sim_pool, state_folder):
    """One process-mode flow: a failed upstream with the tasks after it, and tasks of three GPU shares while an
    MPS control daemon's socket listens (a bound Unix socket where ``slices.mps_available`` looks)."""
    pipe = tmp_path_factory.mktemp("mps")
    daemon = socket.socket(socket.AF_UNIX)
    daemon.bind(str(pipe / "control"))
    daemon.listen()

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("prefect-process", "1x16GiB"), tracking=False))
    def process_flow() -> dict:
        failed = fails.submit()
        allowed = after_an_upstream.submit(allow_failure(failed), wait_for=[allow_failure(failed)])
        not_ready = after_an_upstream.submit(failed)
        shares = {}
        for gpus in (0.25, 0.5, 1):
            with gpu_options(gpus=gpus):
                shares[gpus] = share.submit()
        for f in (failed, allowed, not_ready, *shares.values()):
            f.wait()
        return {"allowed": allowed.state, "allowed_result": allowed.result(), "not_ready": not_ready.state,
                "not_ready_run": not_ready.task_run_id, "shares": {g: f.result() for g, f in shares.items()}}

    try:
        with state_folder("prefect-process"), pytest.MonkeyPatch.context() as env:
            env.setenv(MPS_PIPE_ENV, str(pipe))
            out = process_flow()
            out["events"] = sim_pool("prefect-process", "1x16GiB").open_ledger().events()
    finally:
        daemon.close()
    return out


def test_allow_failure_in_wait_for_and_in_a_parameter_runs_the_task_on_its_slice(process_run):
    """``wait_for=[allow_failure(f)]`` used to raise ``TypeError: unhashable type: 'allow_failure'``, and a task
    whose allowed upstream failed ran without a slice."""
    assert process_run["allowed"].type == StateType.COMPLETED
    assert process_run["allowed_result"] == {"fraction": 0.5, "x": "RuntimeError"}


def test_a_task_whose_upstream_failed_is_not_ready_and_takes_no_slice(process_run):
    """Prefect's engine decides it (Pending "NotReady"), as with Prefect's runners; it used to end Crashed."""
    state = process_run["not_ready"]
    assert state.type == StateType.PENDING and state.name == "NotReady"
    assert api_state(process_run["not_ready_run"]).name == "NotReady"
    allocated = [e["label"] for e in process_run["events"] if e["kind"] == "allocate"]
    assert allocated.count("after_an_upstream") == 1  # only the allowed one took a slice


def test_each_worker_process_starts_with_its_tasks_mps_share(process_run):
    """CUDA reads the MPS percentage when the process creates its context: each share has workers of its own."""
    shares = process_run["shares"]
    assert {g: s["mps"] for g, s in shares.items()} == {0.25: "25", 0.5: "50", 1: None}
    assert len({s["pid"] for s in shares.values()}) == 3


@task
def echo(x: int = 1) -> int:
    return x


def test_a_task_depending_on_itself_raises_prefects_value_error(sim_pool, state_dir):
    """Prefect's engine raises for a task in its own ``wait_for``; its future raises that error (it used to
    end CrashedRun)."""
    go = threading.Event()

    @task
    def gate() -> None:
        go.wait(30)

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("self", "1x16GiB"), mode="thread", tracking=False))
    def self_flow():
        wait_for = [gate.submit()]
        future = echo.submit(wait_for=wait_for)
        wait_for.append(future)  # before the gate opens: the engine finds the task among its own upstreams
        go.set()
        return future.result(timeout=60)

    with pytest.raises(ValueError, match="task depending on itself"):
        self_flow()


def test_tasks_the_flow_never_waits_for_run_to_completion(sim_pool, state_dir, tmp_path):
    """Our choice (Prefect's thread runner cancels tasks that have not started when the flow returns): every
    submitted task runs, waited for or not. The second task is still queued behind the first when the flow body
    returns, and it completes."""
    holding, returned = threading.Event(), threading.Event()

    @gpu_request(gpus=1)
    @task
    def holds_until_the_flow_returned() -> None:
        holding.set()
        returned.wait(60)

    @gpu_request(gpus=1)
    @task
    def queued_behind(path: str) -> None:
        Path(path).write_text("ran")

    ids = []

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("unwaited", "1x16GiB"), mode="thread", tracking=False))
    def unwaited_flow() -> None:
        ids.append(holds_until_the_flow_returned.submit().task_run_id)
        assert holding.wait(60)
        ids.append(queued_behind.submit(str(tmp_path / "second")).task_run_id)
        returned.set()

    unwaited_flow()
    assert (tmp_path / "second").read_text() == "ran"
    assert [final_task_run_state(i).type for i in ids] == [StateType.COMPLETED] * 2
