"""MLflow tracking under real faults: flows of separate processes opening one fresh
SQLite store at once, flows killed with SIGKILL or SIGTERM, a Cilantro flow killed between saving a round and
logging it, a store left half-migrated, a store that cannot be used at all."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

import flows.allocation_rounds as ar
from tasks.cilantro.allocator import state_path
from resource_blocks import GpuPool, MlflowTarget

pytestmark = pytest.mark.usefixtures("prefect_server")

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(round_s=1.0, report_s=0.5, trace_step=10, mode="thread")  # a round costs up to round_s of CPU

# A small tracked flow in a process of its own. It waits for the file `go` (so that several start at once),
# runs `n` tasks and prints its MLflow run id and its tracker's errors; with `hang` it writes the run id to
# `<go>.<pid>` instead and waits to be killed.
FLOW = """
import json, os, sys, threading, time
from pathlib import Path
from prefect import flow, task
from resource_blocks import GpuPool, MlflowTarget
from tasks.runtime.runners import GpuTaskRunner, flow_mlflow_run_id
from tasks.runtime.tracking import flow_tracker

uri, n, go, hang = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "hang"

@task
def work(i):
    return i

@flow(task_runner=GpuTaskRunner(pool=GpuPool(name="faults", device_backend="simulated", simulated="1x16GiB"),
                                mode="thread", tracking=MlflowTarget(tracking_uri=uri, experiment="faults")))
def small_flow():
    [f.wait() for f in [work.submit(i) for i in range(n)]]
    parent, errors = flow_mlflow_run_id(), flow_tracker().flush()
    if hang:
        Path(f"{go}.{os.getpid()}").write_text(parent)
        threading.Event().wait()
    return {"parent": parent, "errors": errors}

deadline = time.monotonic() + 300
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
print("RESULT " + json.dumps(small_flow()))
"""


def _python(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _children(client, parent: str) -> list:
    exp = client.get_run(parent).info.experiment_id
    return client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'", max_results=1000)


# Tasks per flow when four flows log to one fresh store at once: each flow's tracker writes several batches of
# finished tasks (it gathers them for 0.2 s) while the others write theirs.
TASKS_AT_ONCE = 16


def test_flows_started_together_on_a_fresh_store_log_every_run_and_task(state_dir):
    uri, go = f"sqlite:///{state_dir}/mlflow.db", state_dir / "go"
    state_dir.mkdir(parents=True)
    procs = [_python(FLOW, uri, str(TASKS_AT_ONCE), str(go), "run") for _ in range(4)]
    go.touch()  # the processes import Prefect and MLflow meanwhile, then all open the store at once
    results = []
    for proc in procs:
        out = proc.communicate(timeout=400)[0]
        assert proc.returncode == 0, out[-3000:]
        results.append(json.loads(out.split("RESULT ", 1)[1]))
    client = _client(uri)
    assert all(r["parent"] for r in results) and len({r["parent"] for r in results}) == 4
    for r in results:
        assert r["errors"] == []
        assert client.get_run(r["parent"]).info.status == "FINISHED"
        children = _children(client, r["parent"])
        assert len(children) == TASKS_AT_ONCE and {c.info.status for c in children} == {"FINISHED"}


def _hanging_flow(state_dir: Path, tasks: int):
    """A flow process whose ``tasks`` tasks finished and which then hangs: (store URI, process, its MLflow run)."""
    uri, go = f"sqlite:///{state_dir}/mlflow.db", state_dir / "go"
    state_dir.mkdir(parents=True)
    go.touch()
    proc = _python(FLOW, uri, str(tasks), str(go), "hang")
    return uri, proc, _wait_for(Path(f"{go}.{proc.pid}"), proc)


def test_a_kill_9_flow_run_is_marked_killed_by_the_next_tracker(state_dir):
    from tasks.runtime.tracking import RunTracker

    uri, proc, parent = _hanging_flow(state_dir, 3)
    client = _client(uri)
    assert client.get_run(parent).info.status == "RUNNING"
    alive = RunTracker(uri, "faults", "alive")  # a run of a live process (this one) must stay RUNNING
    assert alive.wait_parent() is not None
    proc.kill()
    proc.wait(60)
    assert client.get_run(parent).info.status == "RUNNING"  # nobody ended it: it died
    later = RunTracker(uri, "faults", "later")
    later.close()
    assert later.healthy
    assert client.get_run(parent).info.status == "KILLED"
    assert [c.info.status for c in _children(client, parent)] == ["FINISHED"] * 3
    assert client.get_run(alive.parent_run_id).info.status == "RUNNING"
    alive.close()
    assert client.get_run(alive.parent_run_id).info.status == "FINISHED"


def test_a_flow_run_ended_by_sigterm_is_killed_in_mlflow(state_dir):
    uri, proc, parent = _hanging_flow(state_dir, 2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out[-3000:]
    assert _client(uri).get_run(parent).info.status == "KILLED"  # ended by the dying flow itself, no sweeper


def test_the_mlflow_status_of_a_flow_run_follows_its_prefect_state(state_dir):
    from prefect import flow, task

    from tasks.runtime.runners import GpuTaskRunner, flow_mlflow_run_id

    target = MlflowTarget(experiment="faults-states")
    parents = []

    @task
    def work(i):
        return i

    @flow(task_runner=GpuTaskRunner(pool=GpuPool(name="states", device_backend="simulated", simulated="1x16GiB"),
                                    mode="thread", tracking=target))
    def ends(fail: bool):
        [f.wait() for f in [work.submit(i) for i in range(2)]]
        parents.append(flow_mlflow_run_id())
        if fail:
            raise ValueError("the flow failed after its tasks")

    ends(False)
    assert ends(True, return_state=True).is_failed()
    client = _client(target.resolved_uri())
    assert [client.get_run(p).info.status for p in parents] == ["FINISHED", "FAILED"]
    for p in parents:
        assert [c.info.status for c in _children(client, p)] == ["FINISHED"] * 2


def test_a_tracker_that_cannot_log_says_so_in_the_flow_result(state_dir, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # the store's folder cannot be created
    out = ar.allocation_rounds(rounds=1, pool=GpuPool(name="cil-broken", device_backend="simulated",
                                                      simulated="1x16GiB"), run_name="broken",
                               tracking=MlflowTarget(tracking_uri=f"sqlite:///{blocker}/mlflow.db"), **SMALL)
    assert [r["round"] for r in out["rounds"]] == [0] and out["mlflow_run_id"] is None
    assert len(out["mlflow_errors"]) == 1 and "could not create the flow's MLflow run" in out["mlflow_errors"][0]

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterLevel

    deadline = time.monotonic() + 60  # and at ERROR in the flow run's Prefect logs (sent in the background)
    while True:
        with get_client(sync_client=True) as client:
            errors = client.read_logs(LogFilter(level=LogFilterLevel(ge_=40)))
        if any("could not create the flow's MLflow run" in e.message and e.flow_run_id for e in errors):
            break
        assert time.monotonic() < deadline, [e.message[:200] for e in errors]
        time.sleep(0.2)


# A Cilantro flow killed (SIGKILL, from inside the real code path) after round 1's state was saved: before its
# MLflow run was created ("after_save") or after it was created and filled but before it was ended ("mid_log").
CILANTRO = """
import os, signal, sys
import flows.allocation_rounds as ar
from resource_blocks import GpuPool, MlflowTarget

uri, point = sys.argv[1], sys.argv[2]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "after_save":
    import tasks.cilantro.records as cr
    real_log_round = cr.log_round
    cr.log_round = lambda client, rec: die() if rec["round"] == 1 else real_log_round(client, rec)
else:
    from mlflow import MlflowClient
    real_log_batch = MlflowClient.log_batch

    def log_batch(self, run_id, metrics=(), params=(), tags=(), **kw):
        real_log_batch(self, run_id, metrics=metrics, params=params, tags=tags, **kw)
        if any(t.key == "cilantro.round" and t.value == "1" for t in tags):
            die()

    MlflowClient.log_batch = log_batch
ar.allocation_rounds(rounds=3, pool=GpuPool(name="cil-kill", device_backend="simulated", simulated="1x16GiB"),
                     run_name="killed", tracking=MlflowTarget(tracking_uri=uri, experiment="cilantro-kill"),
                     round_s=1.0, report_s=0.5, trace_step=10, mode="thread")
"""


@pytest.mark.parametrize("point", ["after_save", "mid_log"])
def test_a_cilantro_flow_killed_between_saving_and_logging_a_round_logs_it_once_on_resume(state_dir, point):
    uri = f"sqlite:///{state_dir}/mlflow.db"
    target = MlflowTarget(tracking_uri=uri, experiment="cilantro-kill")
    proc = _python(CILANTRO, uri, point)
    out = proc.communicate(timeout=400)[0]
    assert proc.returncode == -signal.SIGKILL, out[-3000:]
    saved = json.loads(state_path("killed").read_text())
    assert saved["next_round"] == 2 and [r["round"] for r in saved["unlogged"]] == [1]
    killed_parent = saved["unlogged"][0]["parent"]

    kw = dict(pool=GpuPool(name="cil-kill", device_backend="simulated", simulated="1x16GiB"), run_name="killed",
              tracking=target, **SMALL)
    first = ar.allocation_rounds(rounds=1, **kw)
    second = ar.allocation_rounds(rounds=1, **kw)  # round 2's record is still in the file: logged already
    assert [r["round"] for r in first["rounds"] + second["rounds"]] == [2, 3]
    assert first["mlflow_errors"] == second["mlflow_errors"] == []

    client = _client(uri)
    exp = client.get_experiment_by_name("cilantro-kill").experiment_id
    runs = client.search_runs([exp], "tags.`cilantro.run_name` = 'killed'")
    assert sorted(int(r.data.tags["cilantro.round"]) for r in runs) == [0, 1, 2, 3]  # each round exactly once
    by_round = {int(r.data.tags["cilantro.round"]): r for r in runs}
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert [by_round[r].data.tags["mlflow.parentRunId"] for r in range(4)] == \
        [killed_parent, killed_parent, first["mlflow_run_id"], second["mlflow_run_id"]]
    assert "social_welfare" in by_round[1].data.metrics and by_round[1].data.params["policy"] == "cilantro-njc"
    assert client.get_run(killed_parent).info.status == "KILLED"
    assert first["rounds"][0]["mlflow_run_id"] == by_round[2].info.run_id


def _copy_store(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite store (the backup API), at a path this process has never opened."""
    dst.parent.mkdir(parents=True)
    with closing(sqlite3.connect(src)) as a, closing(sqlite3.connect(dst)) as b:
        a.backup(b)


def test_a_store_left_half_migrated_is_set_aside_only_when_it_holds_no_run(tmp_path):
    from tasks.runtime.tracking import open_client

    # One store really migrated, copied before and after it got a run; MLflow caches a store per URI and
    # open_client per process, so the two copies are opened below as fresh by this process.
    seed = tmp_path / "seed" / "mlflow.db"
    seed.parent.mkdir()
    client = open_client(f"sqlite:///{seed}")
    empty, used = tmp_path / "empty" / "mlflow.db", tmp_path / "used" / "mlflow.db"
    _copy_store(seed, empty)
    client.set_terminated(client.create_run("0").info.run_id)
    _copy_store(seed, used)
    for db in (empty, used):  # as a migration killed while it rebuilt the experiments table leaves it
        with sqlite3.connect(db) as con:
            con.execute("UPDATE alembic_version SET version_num = 'c8d9e0f1a2b3'")
            con.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")

    client = open_client(f"sqlite:///{empty}")
    client.set_terminated(client.create_run("0").info.run_id)
    assert len(list(empty.parent.glob("mlflow.db.broken-*"))) == 1

    before = used.read_bytes()
    with pytest.raises(Exception, match="_alembic_tmp_experiments|out-of-date"):
        open_client(f"sqlite:///{used}")
    assert used.read_bytes() == before and not list(used.parent.glob("mlflow.db.broken-*"))
