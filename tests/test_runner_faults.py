"""The local GPU task runner under real faults: its flow process killed with SIGKILL or SIGTERM, the
pool ledger locked by another connection, a lease reclaimed while its task runs. Each fault is
injected for real and the outcome read back from the operating system (/proc), the pool ledger and
the Prefect API."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectNotFound
from prefect.states import StateType

from gpu.pool import pool_path
from resource_blocks import GpuPool
from tasks.runtime.requests import current_placement, gpu_request
from tasks.runtime.runners import GpuTaskRunner
from tests.polling import final_task_run_state, poll

pytestmark = pytest.mark.usefixtures("prefect_server")

REPO = Path(__file__).resolve().parents[1]


def sim_pool(name: str, spec: str = "2x16GiB") -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated=spec)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed orphan may wait to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def pid_files(folder: Path, prefix: str) -> dict[str, int]:
    return {p.name: int(p.read_text()) for p in folder.glob(f"{prefix}*")}


# Flows run in their own process by the tests below (``python faultflows.py OUT waiting|-``).
# Their GPU tasks record the pid of the process running them, then work until they are killed.
_FAULT_FLOWS = """
import json, os, subprocess, sys, time
from pathlib import Path

from prefect import flow, task

from resource_blocks import GpuPool
from tasks.runtime.requests import gpu_request
from tasks.runtime.runners import GpuTaskRunner


DAEMONIZE = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], "
             "start_new_session=True); open(sys.argv[1], 'w').write(str(p.pid))")


@gpu_request(gpus=1)
@task
def spin(out: str, i: int) -> None:
    # a double-forked daemon: an intermediate process starts it in a session of its own and exits
    subprocess.run([sys.executable, "-c", DAEMONIZE, str(Path(out) / f"daemon-{i}")], check=True)
    tmp = Path(out) / f".worker-{i}"
    tmp.write_text(str(os.getpid()))
    tmp.rename(Path(out) / f"worker-{i}")  # whole, or not there
    os.nice(19)  # busy, but leaves the CPU to the rest of the test
    n = 0
    while True:
        n += 1


@gpu_request(gpus=1)
@task
def waits_for_a_gpu() -> None:
    pass


class TimedRunner(GpuTaskRunner):
    # writes which exception left the runner, and how long leaving took, to OUT/exit

    def __exit__(self, exc_type, exc_value, traceback):
        started = time.monotonic()
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        finally:
            (Path(os.environ["FAULT_OUT"]) / "exit").write_text(
                json.dumps([getattr(exc_type, "__name__", None), time.monotonic() - started]))


@flow(task_runner=TimedRunner(pool=GpuPool(name="faults", device_backend="simulated", simulated="2x16GiB"),
                              mode="process", tracking=False))
def fault_flow(out: str, waiting: bool):
    futures = [spin.submit(out, i) for i in range(2)]
    if waiting:  # submitted once both spinners run (dispatch threads reach the ledger in any order)
        while len(list(Path(out).glob("worker-*"))) < 2:
            time.sleep(0.05)
        futures.append(waits_for_a_gpu.submit())  # both GPUs are taken: it waits in the ledger queue
    (Path(out) / ".task_runs").write_text(json.dumps([str(f.task_run_id) for f in futures]))
    (Path(out) / ".task_runs").rename(Path(out) / "task_runs")  # whole, or not there
    [f.wait() for f in futures]


if __name__ == "__main__":  # process workers import this module too
    os.environ["FAULT_OUT"] = sys.argv[1]
    if sys.argv[2] == "serve":
        fault_flow.serve(name="faults", pause_on_shutdown=False)
    else:
        fault_flow(sys.argv[1], waiting=sys.argv[2] == "waiting")
"""


def start_fault_flow(tmp_path: Path, state_dir: Path, waiting: bool) -> tuple[subprocess.Popen, dict[str, int]]:
    """Start ``fault_flow`` in a process of its own, in a session of its own as ``serve()`` runs flows;
    return it and the pids of the process workers running its two spinning tasks, once both run."""
    (tmp_path / "faultflows.py").write_text(_FAULT_FLOWS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "GPUFLOWS_STATE_DIR": str(state_dir), "PREFECT_LOGGING_LEVEL": "INFO"}
    log = tmp_path / "flow.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(tmp_path / "faultflows.py"), str(tmp_path),
                                 "waiting" if waiting else "-"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def running() -> dict[str, int]:
        assert proc.poll() is None, f"the flow process exited early:\n{log.read_text()[-3000:]}"
        workers = pid_files(tmp_path, "worker-")
        return len(workers) == 2 and workers

    try:
        workers = poll(running, 180, "both tasks running in process workers")
        assert all(parent_of(pid) == proc.pid and alive(pid) for pid in workers.values())
    except BaseException:
        stop_fault_flow(proc, tmp_path)
        print(log.read_text()[-5000:])
        raise
    return proc, workers


def stop_fault_flow(proc: subprocess.Popen, tmp_path: Path) -> None:
    """Leave no flow process and no spinning worker behind, whatever the test found."""
    proc.kill()
    proc.wait(30)
    for pid in [*pid_files(tmp_path, "worker-").values(), *pid_files(tmp_path, "daemon-").values()]:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_process_workers_die_with_their_flow_process_after_kill_9(state_dir, tmp_path):
    proc, workers = start_fault_flow(tmp_path, state_dir, waiting=False)
    try:
        assert len(sim_pool("faults").open_ledger().leases()) == 2
        daemons = pid_files(tmp_path, "daemon-")
        assert len(daemons) == 2 and all(alive(pid) and parent_of(pid) not in workers.values()
                                         for pid in daemons.values())  # out of the workers' tree already
        proc.kill()  # SIGKILL: the flow process gets no chance to clean up
        proc.wait(30)
        poll(lambda: not any(alive(pid) for pid in workers.values()), 2.0,
             f"worker processes {sorted(workers.values())} gone after their flow process was killed")
        poll(lambda: not any(alive(pid) for pid in daemons.values()), 2.0,
             f"the daemons {sorted(daemons.values())} their tasks started gone with them")
    finally:
        stop_fault_flow(proc, tmp_path)


def test_sigterm_to_the_flow_cancels_its_tasks_at_once_kills_workers_and_releases_leases(state_dir, tmp_path):
    """SIGTERM to the flow's process group is how Prefect stops a served flow run (a cancellation, a
    worker's shutdown): its handler raises TerminationSignal in the flow, which leaves the task runner,
    and the process workers get the signal too. The runner must stop at once (it used to wait for its
    tasks), leave no worker running, release every lease and record the tasks as Cancelled."""
    proc, workers = start_fault_flow(tmp_path, state_dir, waiting=True)
    try:
        ledger = sim_pool("faults").open_ledger()
        poll(lambda: ledger.waiting() == 1 and (tmp_path / "task_runs").exists(), 30,
             "the third task waiting for a GPU, the flow's task runs written")
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) != 0
        exc_name, took = json.loads((tmp_path / "exit").read_text())
        assert exc_name == "TerminationSignal" and took < 3.0, f"leaving the runner took {took:.1f}s"
        assert not any(alive(pid) for pid in workers.values())
        assert ledger.leases() == [] and ledger.waiting() == 0
        kinds = [e["kind"] for e in ledger.events()]  # released by the runner, not reclaimed after its death
        assert "reclaim" not in kinds and kinds.count("release") == kinds.count("allocate") >= 2
        spinning = json.loads((tmp_path / "task_runs").read_text())[:2]
        states = [final_task_run_state(i) for i in spinning]
        assert [s.type for s in states] == [StateType.CANCELLED] * 2, [s.message for s in states]
    finally:
        stop_fault_flow(proc, tmp_path)


def test_release_refused_by_a_locked_ledger_is_retried_and_the_task_stays_completed(state_dir):
    runner = GpuTaskRunner(pool=sim_pool("locked", "1x16GiB"), mode="thread", tracking=False)
    release_failed, locked = threading.Event(), threading.Event()

    class ReleaseFailures(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("release of lease"):
                release_failed.set()

    def hold_the_ledger_lock() -> None:
        db = sqlite3.connect(pool_path("locked"), isolation_level=None)
        db.execute("BEGIN IMMEDIATE")  # a second process's write transaction on the ledger
        locked.set()
        release_failed.wait(60)        # held until the runner's release has failed at least once
        db.execute("ROLLBACK")
        db.close()

    @gpu_request(gpus=1)
    @task
    def finishes_while_the_ledger_is_locked() -> str:
        threading.Thread(target=hold_the_ledger_lock, daemon=True).start()
        assert locked.wait(30)
        return "done"

    @flow(task_runner=runner)
    def locked_flow():
        # The ledger waits 30 s for SQLite's lock before it raises; make the fault show in 50 ms.
        FlowRunContext.get().task_runner.ledger().lock_timeout = 0.05
        future = finishes_while_the_ledger_is_locked.submit()
        future.wait()
        return future.state, future.task_run_id

    handler = ReleaseFailures()
    runner.logger.addHandler(handler)
    try:
        state, task_run_id = locked_flow()
    finally:
        runner.logger.removeHandler(handler)
    assert release_failed.is_set()
    assert state.type == StateType.COMPLETED and state.result() == "done"
    assert final_task_run_state(task_run_id).type == StateType.COMPLETED
    ledger = sim_pool("locked", "1x16GiB").open_ledger()
    assert ledger.leases() == []
    assert [e["kind"] for e in ledger.events()] == ["allocate", "release"]


@pytest.mark.parametrize("fails_by_itself", [False, True], ids=["completes", "fails-by-itself"])
def test_task_whose_lease_was_reclaimed_while_it_ran_fails_naming_the_lease(state_dir, fails_by_itself):
    @gpu_request(gpus=1)
    @task
    def loses_its_lease(fail: bool) -> None:
        # what the ledger's reclaim does, done by another connection while the task runs
        db = sqlite3.connect(pool_path("reclaimed"))
        assert db.execute("DELETE FROM leases WHERE id=?", (current_placement().placement.lease_id,)).rowcount == 1
        db.commit()
        db.close()
        if fail:
            raise RuntimeError("the task failed by itself")

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("reclaimed", "1x16GiB"), mode="thread", tracking=False))
    def reclaim_flow():
        future = loses_its_lease.submit(fails_by_itself)
        future.wait()
        return future.state, future.task_run_id

    state, task_run_id = reclaim_flow()
    ledger = sim_pool("reclaimed", "1x16GiB").open_ledger()
    (lease_id,) = [e["lease_id"] for e in ledger.events() if e["kind"] == "allocate"]
    assert state.type == StateType.FAILED
    assert f"lease {lease_id} of task 'loses_its_lease'" in state.message
    assert "was reclaimed while the task ran" in state.message and "cannot be trusted" in state.message
    recorded = final_task_run_state(task_run_id)
    assert recorded.type == StateType.FAILED
    if fails_by_itself:
        assert "the task failed by itself" in state.message          # its own failure kept, note added
    else:
        assert "reclaimed while the task ran" in recorded.message   # Completed overruled in Prefect too
    assert ledger.leases() == []


def test_lease_lost_reported_from_another_thread_fails_the_task_with_the_reason(state_dir):
    running: dict[str, str] = {}
    started, go_on = threading.Event(), threading.Event()

    @gpu_request(gpus=1)
    @task
    def holds_the_gpu() -> str:
        running["lease_id"] = current_placement().placement.lease_id
        started.set()
        assert go_on.wait(30)
        return "finished"

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("lost", "1x16GiB"), mode="thread", tracking=False))
    def lost_flow():
        runner = FlowRunContext.get().task_runner
        future = holds_the_gpu.submit()
        assert started.wait(30)
        reported = []
        reporter = threading.Thread(target=lambda: reported.append(
            runner._lease_lost(running["lease_id"], "heartbeat found the lease expired")))
        reporter.start()
        reporter.join()
        cancel_set = runner._cancel_events[future.task_run_id].is_set()
        go_on.set()
        future.wait()
        return future.state, reported, cancel_set, runner._lease_lost("no-such-lease", "ignored")

    state, reported, cancel_set, unknown = lost_flow()
    assert reported == [True] and cancel_set and unknown is False
    assert state.type == StateType.FAILED
    assert f"lease {running['lease_id']} of task 'holds_the_gpu'" in state.message
    assert "heartbeat found the lease expired" in state.message
    assert sim_pool("lost", "1x16GiB").open_ledger().leases() == []


@gpu_request(gpus=0.5)
@task
def killed_from_outside(out: str) -> None:
    (Path(out) / "victim").write_text(str(os.getpid()))
    signal.pause()  # until the test kills its process


@gpu_request(gpus=0.5)
@task
def outlives_its_neighbour(out: str) -> int:
    """Runs on its half of the GPU until its neighbour's crash is settled, then finishes."""
    (Path(out) / "sibling").write_text(str(os.getpid()))
    settled, polls = Path(out) / "victim-settled", 0
    while not settled.exists() and polls < 3000:
        polls += 1
        time.sleep(0.02)
    (Path(out) / "sibling-done").touch()
    return os.getpid()


@gpu_request(gpus=1)
@task
def after_the_sibling(out: str) -> bool:
    return (Path(out) / "sibling-done").exists()


def test_a_killed_worker_crashes_only_its_own_task_and_its_sibling_keeps_its_slice(state_dir, tmp_path):
    """Two half-GPU tasks in two worker processes; kill -9 one. Only its task ends Crashed: the sibling computes
    on and ends Completed (in Prefect too), and the whole GPU goes to the next task only once the sibling is done.
    (In one shared process pool, Python failed both futures at the kill and the runner freed both slices.)"""
    out = str(tmp_path)

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("sibling", "1x16GiB"), tracking=False))
    def sibling_flow():
        sibling = outlives_its_neighbour.submit(out)
        victim = killed_from_outside.submit(out)
        poll(lambda: (tmp_path / "victim").exists() and (tmp_path / "sibling").exists(), 120, "both tasks running")
        whole = after_the_sibling.submit(out)  # waits in the ledger: the two halves hold the GPU
        os.kill(int((tmp_path / "victim").read_text()), signal.SIGKILL)
        victim.wait()
        (tmp_path / "victim-settled").touch()
        sibling_pid, whole_after_sibling = sibling.result(), whole.result()
        return victim.state, sibling.state, sibling.task_run_id, sibling_pid, whole_after_sibling

    victim, sibling, sibling_run, sibling_pid, whole_after_sibling = sibling_flow()
    assert victim.type == StateType.CRASHED and "SIGKILL" in victim.message
    assert sibling.type == StateType.COMPLETED and sibling_pid == int((tmp_path / "sibling").read_text())
    assert final_task_run_state(sibling_run).type == StateType.COMPLETED
    assert whole_after_sibling
    assert sim_pool("sibling", "1x16GiB").open_ledger().leases() == []


DAEMONIZE = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], "
             "start_new_session=True); open(sys.argv[1], 'w').write(str(p.pid))")


@gpu_request(gpus=1)
@task
def leaves_processes(out: str, tag: str, die: bool) -> None:
    """Starts a child and a double-forked daemon (in a session of its own), then returns or is killed."""
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    subprocess.run([sys.executable, "-c", DAEMONIZE, str(Path(out) / f"{tag}-daemon")], check=True)
    (Path(out) / f"{tag}-child").write_text(str(child.pid))
    if die:
        os.kill(os.getpid(), signal.SIGKILL)


@gpu_request(gpus=1)
@task
def next_on_the_gpu(out: str, tag: str) -> list[bool]:
    """Whether the previous holder's child and daemon are alive now that this task holds the GPU."""
    return [alive(int((Path(out) / f"{tag}-{what}").read_text())) for what in ("child", "daemon")]


def test_a_tasks_processes_end_with_it_before_its_gpu_is_granted_again(state_dir, tmp_path):
    """A task starts a child and a double-forked daemon on its GPU, then returns, or its worker is killed with
    SIGKILL. Either way what it started is killed when it ends, and the GPU's next holder starts only once they
    are dead. (They used to run on, and the GPU was granted again 0.3 s after the worker died.)"""
    out = str(tmp_path)

    @flow(task_runner=GpuTaskRunner(pool=sim_pool("leftovers", "1x16GiB"), tracking=False))
    def leftovers_flow():
        seen = {}
        for tag, die in (("returned", False), ("killed", True)):
            first = leaves_processes.submit(out, tag, die)
            poll(lambda: (tmp_path / f"{tag}-child").exists(), 120, f"{tag}: the first task's processes started")
            seen[tag] = (next_on_the_gpu.submit(out, tag).result(), first.state)  # queued behind the first
        return seen

    try:
        seen = leftovers_flow()
        assert seen["returned"][0] == [False, False] and seen["killed"][0] == [False, False]
        assert seen["returned"][1].type == StateType.COMPLETED
        assert seen["killed"][1].type == StateType.CRASHED and "SIGKILL" in seen["killed"][1].message
        assert sim_pool("leftovers", "1x16GiB").open_ledger().leases() == []
    finally:
        for pid in [*pid_files(tmp_path, "returned-").values(), *pid_files(tmp_path, "killed-").values()]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_cancelling_a_served_flow_run_cancels_its_tasks_at_once_and_releases_leases(state_dir, tmp_path):
    """A real Prefect cancellation: the flow is served with ``flow.serve()``, its run is set Cancelling
    through the API, and Prefect's runner stops the run's process group."""
    from prefect.states import Cancelling

    (tmp_path / "faultflows.py").write_text(_FAULT_FLOWS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "GPUFLOWS_STATE_DIR": str(state_dir), "PREFECT_LOGGING_LEVEL": "INFO",
           "PREFECT_RUNNER_POLL_FREQUENCY": "1", "FAULT_OUT": str(tmp_path)}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "faultflows.py", str(tmp_path), "serve"], cwd=tmp_path, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    flow_pid = None
    try:
        with get_client(sync_client=True) as client:
            def deployment():
                assert server.poll() is None, log.read_text()[-3000:]
                try:
                    return client.read_deployment_by_name("fault-flow/faults")
                except ObjectNotFound:
                    return None

            run = client.create_flow_run_from_deployment(poll(deployment, 120, "the served deployment").id,
                                                         parameters={"out": str(tmp_path), "waiting": True})
            try:
                workers = poll(lambda: len(pid_files(tmp_path, "worker-")) == 2 and pid_files(tmp_path, "worker-"),
                               180, "both tasks of the served run running in process workers")
            except BaseException:
                print(log.read_text()[-5000:])
                raise
            (flow_pid,) = {parent_of(pid) for pid in workers.values()}  # the run's own process, under serve
            ledger = sim_pool("faults").open_ledger()
            poll(lambda: ledger.waiting() == 1 and (tmp_path / "task_runs").exists(), 30,
                 "the third task waiting for a GPU, the flow's task runs written")
            client.set_flow_run_state(run.id, Cancelling(), force=True)
            poll(lambda: client.read_flow_run(run.id).state.is_cancelled(), 60, "the flow run Cancelled")
        exc_name, took = json.loads(poll(lambda: (tmp_path / "exit").is_file() and (tmp_path / "exit").read_text(),
                                         30, "the runner left"))
        assert exc_name == "TerminationSignal" and took < 3.0, f"leaving the runner took {took:.1f}s"
        poll(lambda: not any(alive(pid) for pid in [flow_pid, *workers.values()]), 5, "the run's processes gone")
        assert ledger.leases() == [] and ledger.waiting() == 0
        assert "reclaim" not in [e["kind"] for e in ledger.events()]  # released by the runner itself
        spinning = json.loads((tmp_path / "task_runs").read_text())[:2]
        states = [final_task_run_state(i) for i in spinning]
        assert [s.type for s in states] == [StateType.CANCELLED] * 2, [s.message for s in states]
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the served run has a process group of its own
        server.wait(30)
        for pid in [flow_pid, *pid_files(tmp_path, "worker-").values()]:
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
