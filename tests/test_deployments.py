"""prefect.yaml against a real `prefect server start` and a real process worker.

One server and one worker for the module: every deployment registers, the blocks register, a short interval
schedule fires (the scheduler creates runs, the worker completes one), and every deployment in prefect.yaml,
started with `prefect deployment run` and small parameters, reaches Completed with its task runs, its artifacts
and the two-way link to its MLflow run on the run the user clicks (no subflow in between).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.real_prefect_server import PREFECT, free_port, real_prefect_server, stop

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENTS = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]

# Small runs of every deployment in prefect.yaml, merged over its parameters, each with the table artifact its flow
# publishes (tests/deployment_runs.yaml: a new deployment adds data there, not code here).
SMALL = {name: (run["parameters"], run["table"])
         for name, run in yaml.safe_load((ROOT / "tests" / "deployment_runs.yaml").read_text()).items()}
SCHEDULED = "every-15s"  # a test-only deployment of pool-demo with an interval schedule


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect-home")),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "GPUFLOWS_HOME": str(ROOT),
           "GPUFLOWS_STATE_DIR": str(tmp_path_factory.mktemp("deploy-state")),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_LOGGING_LEVEL": "INFO",
           # Three runs ahead per schedule, not 100: the tests pause every schedule, which deletes the runs it
           # scheduled, while the deployments' runs start. Statements and connections wait for SQLite's lock as
           # long as a loaded 2-core machine needs: with the defaults (10 s, 5 s) the server once answered a worker
           # submitting a run with 503 (its reply to a retryable database error) at a load of 40.
           "PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS": "3", "PREFECT_SERVER_DATABASE_TIMEOUT": "60",
           "PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT": "60",
           # and the CLI and worker retry what the server still answers 503 for 2 min, not 1 (a load of 10+ seen)
           "PREFECT_CLIENT_MAX_RETRIES": "6"}
    log = tmp_path_factory.mktemp("server-log") / "server.log"
    with real_prefect_server(port, env, ROOT, log):
        yield env
    assert "InvalidRequestError" not in log.read_text(), "the server's scheduler failed:\n" + log.read_text()[-3000:]


def run(args: list[str], env: dict) -> str:
    return run_all([args], env)[0]


def run_all(commands: list[list[str]], env: dict) -> list[str]:
    """The commands at once (each CLI start imports Prefect: seconds of CPU); their stdout, in order."""
    procs = [subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in commands]
    outs = []
    for args, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (args, out[-3000:] + err[-3000:])
        outs.append(out)
    return outs


def _pause_schedules(client, deployment) -> None:
    """Pause a deployment's schedules; the server deletes the runs they had scheduled."""
    for schedule in deployment.schedules:
        client.update_deployment_schedule(deployment.id, schedule.id, active=False)


def _client(env: dict):
    from prefect.client.orchestration import SyncPrefectClient

    return SyncPrefectClient(env["PREFECT_API_URL"])


@pytest.fixture(scope="module")
def deployed(real_server):
    """prefect.yaml deployed as written; its own schedules then paused (their full-size runs are not this
    test's to wait for), so the worker sees only the runs the tests start."""
    run([PREFECT, "work-pool", "create", "gpuflows", "--type", "process"], real_server)
    run([PREFECT, "--no-prompt", "deploy", "--all"], real_server)
    with _client(real_server) as client:
        found = {d.name: d for d in client.read_deployments()}
        scheduled = {name for name, d in found.items() if d.schedules}
        for deployment in found.values():
            _pause_schedules(client, deployment)
        for flow_run in client.read_flow_runs():  # anything the scheduler made of them before the pause
            client.delete_flow_run(flow_run.id)
    from mlflow import MlflowClient  # one process creates the MLflow database, not five at once

    MlflowClient(f"sqlite:///{Path(real_server['GPUFLOWS_STATE_DIR']) / 'mlflow.db'}").search_experiments()
    return found, scheduled


@pytest.fixture(scope="module")
def worker(real_server, deployed, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("worker-log") / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", "gpuflows", "--type", "process"],
                                env=real_server, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield log_path
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def started(real_server, deployed, worker):
    """All runs at once, so their waits overlap: the test-only interval deployment (the scheduler's runs) and one
    run per deployment of prefect.yaml with its small parameters, created through the API as the UI's "Run" does
    (the server checks them against the deployment's parameter schema)."""
    found, _ = deployed
    with _client(real_server) as client:
        ids = {name: client.create_flow_run_from_deployment(found[name].id, parameters=params).id
               for name, (params, _) in SMALL.items()}
    run([PREFECT, "--no-prompt", "deploy", "flows/pool_demo.py:pool_demo", "--name", SCHEDULED, "--pool", "gpuflows",
         "--interval", "15", "--params", json.dumps({"tasks": 1, "steps": 2, "mode": "thread", "tracking": False})],
        real_server)
    return ids


def _wait_final(env: dict, ids: list[uuid.UUID], timeout: float, worker_log: Path) -> dict:
    deadline, runs = time.time() + timeout, {}
    with _client(env) as client:
        while time.time() < deadline:
            runs = {i: client.read_flow_run(i) for i in ids}
            if all(r.state and r.state.is_final() for r in runs.values()):
                return runs
            time.sleep(2)
    pytest.fail(f"runs not final in {timeout:.0f} s: {[(r.name, r.state_name) for r in runs.values()]}\n"
                + worker_log.read_text()[-4000:])


@pytest.mark.slow
def test_every_deployment_in_prefect_yaml_registers(real_server, deployed):
    found, scheduled = deployed
    names = [d["name"] for d in DEPLOYMENTS]
    assert names and set(names) <= set(found)
    assert scheduled == {d["name"] for d in DEPLOYMENTS if d.get("schedules")}


@pytest.mark.slow
def test_blocks_register_with_the_prefect_cli(real_server):
    out = run([PREFECT, "block", "register", "-m", "resource_blocks"], real_server)
    for block in ("gpuflows GPU pool", "gpuflows MLflow target", "gpuflows scheduler policy"):
        assert block in out


@pytest.mark.slow
def test_an_interval_schedule_fires_and_a_worker_completes_the_scheduled_run(real_server, started, worker):
    """The scheduler service (SQLAlchemy 2.1 broke it: "Can't evaluate bulk DML statement") creates the runs of a
    15 s interval schedule by itself; the process worker runs one to Completed.

    The schedule is paused as soon as the worker has taken one of its runs: left on, it fires every 15 s and the
    worker starts a flow process (Prefect and torch imported again) for each, beside the deployments' runs."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    only = DeploymentFilter(name=DeploymentFilterName(any_=[SCHEDULED]))
    deadline, runs = time.time() + 150, []
    with _client(real_server) as client:
        while time.time() < deadline:
            runs = client.read_flow_runs(deployment_filter=only)
            if len(runs) >= 2 and any(r.state and not r.state.is_scheduled() for r in runs):
                break
            time.sleep(2)
        _pause_schedules(client, client.read_deployment_by_name(f"pool-demo/{SCHEDULED}"))
        left = client.read_flow_runs(deployment_filter=only)  # what the worker took before the pause, too
    assert len(runs) >= 2 and all(r.auto_scheduled for r in runs), [(r.name, r.state_name) for r in runs]
    taken = [r.id for r in left if r.state and not r.state.is_scheduled()]
    assert taken, [(r.name, r.state_name) for r in left] + [worker.read_text()[-4000:]]
    done = [r for r in _wait_final(real_server, taken, max(1.0, deadline - time.time()), worker).values()
            if r.state.is_completed()]
    assert done, [(r.name, r.state_name) for r in runs] + [worker.read_text()[-4000:]]


@pytest.mark.slow
def test_every_deployment_run_by_a_worker_completes_with_its_tasks_artifacts_and_mlflow_link(real_server, started,
                                                                                               worker):
    from mlflow import MlflowClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId

    assert set(SMALL) == {d["name"] for d in DEPLOYMENTS}, "give every deployment in prefect.yaml small parameters"
    runs = _wait_final(real_server, list(started.values()), 240, worker)
    assert {n: runs[i].state_name for n, i in started.items()} == {n: "Completed" for n in started}, \
        worker.read_text()[-6000:]
    mlflow = MlflowClient(f"sqlite:///{Path(real_server['GPUFLOWS_STATE_DIR']) / 'mlflow.db'}")
    ui = real_server["PREFECT_API_URL"].removesuffix("/api")
    with _client(real_server) as client:
        for name, flow_run_id in started.items():
            assert runs[flow_run_id].parent_task_run_id is None  # the run the user clicks
            # its own page: the task runs and the artifacts are on it, not on a subflow
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            assert tasks and all(t.flow_run_id == flow_run_id for t in tasks), name
            assert not [t for t in tasks if t.state and t.state.state_details.child_flow_run_id], f"{name}: subflow"
            keys = {a.key for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))}
            table = SMALL[name][1]
            assert "mlflow-run" in keys and (table is None or table in keys), (name, keys)
            # ... and its MLflow run links back to it
            found_runs = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()],
                                            f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
            assert len(found_runs) == 1, name
            assert found_runs[0].data.tags["prefect.flow_run_url"] == f"{ui}/runs/flow-run/{flow_run_id}"


def test_the_flows_runner_comes_from_the_decorator_and_survives_duplication_and_pickling():
    """What Prefect does with it per flow run (duplicate) and per task worker process (pickle): the configure hook
    travels by reference until resolved."""
    import cloudpickle

    from flows import pool_demo as module
    from tasks.runtime.runners import GpuTaskRunner

    runner = module.pool_demo.task_runner
    assert isinstance(runner, GpuTaskRunner) and runner.configure is module.runner_settings
    copy = cloudpickle.loads(cloudpickle.dumps(runner.duplicate()))
    assert copy.configure is module.runner_settings and copy == runner


HELP_EACH = """
import runpy, sys
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)  # what `python -m module --help` runs
    except SystemExit as stop:
        assert stop.code in (0, None), (module, stop.code)
    print("=== end of", module, flush=True)
"""


def test_every_flow_module_has_a_cli_with_help():
    """``python -m flows.<name> --help`` for every flow a deployment names, in one interpreter (each start would
    import Prefect and torch again: seconds of CPU per flow)."""
    modules = sorted({"flows." + Path(entry["entrypoint"].split(":")[0]).stem for entry in DEPLOYMENTS})
    out = run([sys.executable, "-c", HELP_EACH, *modules], dict(os.environ))
    for module in modules:
        text, _, out = out.partition(f"=== end of {module}\n")
        assert "usage" in text.lower() and module.split(".")[1] in text, (module, text[-500:])
