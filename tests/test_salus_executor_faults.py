"""Salus under real faults: a job raising mid-iteration, a job's worker process killed with SIGKILL or stopped
with SIGSTOP while it holds its lane's token, and the executor's device lease taken away by the pool ledger. Each
time the others go on (or end Crashed when the device is gone), and nothing hangs."""

from __future__ import annotations

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
import torch
from prefect import flow, task
from prefect.states import StateType

from gpu.liveness import process_state
from gpu.pool import open_pool, pool_path
from gpu.schedulers.salus import live
from gpu.schedulers.salus.controller import SalusJob
from gpu.schedulers.salus.overrun import TokenBound
from gpuflows.cli import main as gpuflows
from resource_blocks import GpuPool
from tasks.runtime.flow import flow_runner
from tasks.runtime.requests import current_placement
from tasks.runtime.runners import GpuTaskRunner
from tasks.salus.admission import SalusColocation, salus_executor
from tasks.salus.executor import SalusExecutor, salus_iterations, salus_job
from tasks.salus.placement import Lane

torch.set_num_threads(1)


def _pool(name: str, **kw) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="1x16GiB", **kw)


def test_a_job_raising_mid_iteration_gives_the_token_back_and_its_lane_shrinks():
    """Three jobs admitted into FAIR's one lane; the one with the largest E fails in its second iteration, holding
    the token: the lane shrinks to the largest E left (L = max E, recomputed on departure) and the other two,
    admitted all along, then run every iteration. (They start after the failure: under FAIR a slow first
    iteration of the failing job would otherwise let them finish first, and there would be nothing to see.)"""
    sizes: dict[str, list[float]] = {"good": [], "small": []}
    errors: dict[str, Exception] = {}
    with SalusExecutor(None, 0, capacity_mb=16_000, policy="fair", lease=False) as ex:
        def run(job: SalusJob, lane: Lane, iterations: int, fail_at: int | None) -> None:
            model, x = torch.nn.Linear(64, 64), torch.randn(128, 64)
            try:
                for step in salus_iterations(iterations, lane):
                    model(x).sum().backward()
                    if step == fail_at:
                        raise RuntimeError("failed mid-iteration")
                    if job.job_id in sizes:
                        with ex._lock:
                            sizes[job.job_id].append(ex.controller.lanes.lane_size(lane.lane_id))
            except RuntimeError as exc:
                errors[job.job_id] = exc
            finally:
                ex.leave(job.job_id)  # what the runner does when the task ends, however it ends

        jobs = [(SalusJob("bad", 100, 3000, on_demand=True), 6, 1),
                (SalusJob("good", 100, 1000, on_demand=True), 12, None),
                (SalusJob("small", 100, 500, on_demand=True), 12, None)]
        lanes = [ex.admit(job) for job, _, _ in jobs]  # all three in the lane before any iteration runs
        assert len({lane.lane_id for lane in lanes}) == 1
        admitted_size = ex.controller.lanes.lane_size(lanes[0].lane_id)
        threads = [threading.Thread(target=run, args=(job, lane, n, fail_at))
                   for (job, n, fail_at), lane in zip(jobs, lanes)]
        threads[0].start()
        threads[0].join(60)
        for t in threads[1:]:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    assert set(errors) == {"bad"}
    assert admitted_size == pytest.approx(3000 * 1.05)       # the lane was sized for the failing job ...
    assert len(sizes["good"]) == len(sizes["small"]) == 12   # ... the others finished every iteration ...
    assert sizes["good"] == pytest.approx([1000 * 1.05] * 12)  # ... in the lane shrunk to the largest E left


ROOT = Path(__file__).resolve().parent.parent
LANE_JOB = """
import os, signal, sys
import numpy as np
from tasks.salus.placement import Lane
from tasks.salus.executor import salus_iterations

address, lane, job, cap, n, stop_at = sys.argv[1:]
w, x = np.random.default_rng(0).standard_normal((2, 128, 128))
for step in salus_iterations(int(n), Lane(int(lane), job, int(cap), address)):
    for _ in range(20):
        w -= 1e-3 * x.T @ (x @ w)  # a few least-squares steps: the iteration's work
    if step == int(stop_at):
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped mid-iteration, holding the lane's token
    print(step, flush=True)
"""


def _start_job(executor: SalusExecutor, lane: Lane, iterations: int, stop_at: int = -1) -> subprocess.Popen:
    """A Salus job in a worker process of its own, on its lane's token service."""
    return subprocess.Popen([sys.executable, "-c", LANE_JOB, executor.address, str(lane.lane_id), lane.job_id,
                             str(lane.memory_cap), str(iterations), str(stop_at)], cwd=ROOT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)


def test_a_job_stopped_while_holding_the_token_loses_it_and_its_lanemate_finishes(state_dir, caplog, capsys):
    """FAIR's one lane, two jobs in worker processes. The first stops itself (SIGSTOP) in its second iteration,
    holding the lane's token: past its bound (a 1 s floor; its first iteration took milliseconds) it loses the
    token, its lane is fenced with its memory, and its lanemate, started only now, runs all its iterations in a
    lane of its own. `gpuflows pool` shows the stopped holder. Resumed (SIGCONT), the job ends its iteration,
    waits for the token again and finishes too."""
    open_pool("stalls", simulated="1x16GiB").close()  # the pool `gpuflows pool --name stalls` describes
    caplog.set_level(logging.WARNING, "gpuflows.salus")
    with SalusExecutor(None, 0, capacity_mb=16_000, policy="fair", lease=False, pool="stalls",
                       token_bound=TokenBound(floor_s=1.0, factor=10.0)) as ex:
        lanes = {job: ex.admit(SalusJob(job, 100, 1000, on_demand=True)) for job in ("stopped", "other")}
        assert lanes["stopped"].lane_id == lanes["other"].lane_id  # time-shared in one lane
        procs = {"stopped": _start_job(ex, lanes["stopped"], 6, stop_at=1)}
        try:
            deadline = time.monotonic() + 120
            while process_state(procs["stopped"].pid) != "T" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert process_state(procs["stopped"].pid) == "T"
            procs["other"] = _start_job(ex, lanes["other"], 20)
            other_out, _ = procs["other"].communicate(timeout=120)  # before the bound: waits for ever
            ex.leave("other")
            assert procs["other"].returncode == 0 and other_out.split() == [str(i) for i in range(20)]

            capsys.readouterr()
            assert gpuflows(["pool", "--name", "stalls"]) == 0  # the operator's view, over the token socket
            shown = capsys.readouterr().out
            assert "salus gpu0" in shown and f"token: stopped for" in shown, shown
            assert f"REVOKED past its bound, process {procs['stopped'].pid} stopped" in shown, shown
            [status] = live.executors("stalls")
            [fence] = [lane for lane in status["lanes"] if lane["fenced"]]
            assert fence["jobs"] == ["stopped"] and fence["holder"]["revoked"]
            assert fence["holder"]["process"] == "stopped" and fence["holder"]["pid"] == procs["stopped"].pid
            assert any("stopped" in r.getMessage() and "past its bound" in r.getMessage() for r in caplog.records)

            os.kill(procs["stopped"].pid, signal.SIGCONT)
            stopped_out, _ = procs["stopped"].communicate(timeout=120)
            assert procs["stopped"].returncode == 0 and stopped_out.split() == [str(i) for i in range(6)]
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                    proc.wait()
        ex.leave("stopped")
    assert live.executors("stalls") == []  # closed: no longer listed


@salus_job(persistent="200MiB", ephemeral="1GiB")
@task
def killed_or_not(marker: str, kill: bool) -> bool:
    """Job A dies by SIGKILL in its second iteration (its worker process, abruptly: no token handed back); job B
    reports whether A had died before B's first iteration ran."""
    a_died_first = None
    for step in salus_iterations(3):
        if kill and step == 1:
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if a_died_first is None:
            a_died_first = os.path.exists(marker)
    return a_died_first


@pytest.mark.usefixtures("prefect_server")
def test_a_job_whose_worker_is_killed_frees_its_lane_and_the_queued_job_is_admitted(state_dir, tmp_path):
    marker = str(tmp_path / "a-died")

    @flow(task_runner=GpuTaskRunner(pool=_pool("salus-kill"), admission=SalusColocation(policy="fifo",
                                    max_jobs_per_device=2), tracking=False))
    def one_killed():
        a = killed_or_not.submit(marker, True)
        executor = salus_executor(flow_runner(), 0)
        deadline = time.monotonic() + 60
        while not executor.controller.lanes.persistent and time.monotonic() < deadline:  # A admitted first
            time.sleep(0.01)
        b = killed_or_not.submit(marker, False)  # FIFO: one job on the device at a time, B queues behind A
        a.wait(120), b.wait(120)
        return a.state, b.state

    a, b = one_killed()
    assert a.type == StateType.CRASHED and "worker process died" in a.message
    assert b.type == StateType.COMPLETED and b.result() is True
    assert _pool("salus-kill").open_ledger().leases() == []


@task
def iterates_until_its_neighbour_died(out: str, killed: bool) -> int:
    """Job A starts iterating once job B's process runs, and dies by SIGKILL in its second iteration; job B
    iterates until A has died, then twice more: its iterations after A's death are what it returns."""
    if not killed:
        Path(out, "b-started").touch()
    while not Path(out, "b-started").exists():
        time.sleep(0.02)
    after = 0
    for step in salus_iterations(100_000):
        if killed and step == 1:
            Path(out, "a-died").touch()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.randn(64, 64).sum()
        if Path(out, "a-died").exists():
            after += 1
            if after == 3:
                break
    return after


@pytest.mark.usefixtures("prefect_server")
def test_a_job_whose_worker_is_killed_takes_no_other_job_with_it(state_dir, tmp_path):
    """Two jobs admitted side by side under FAIR, each in its worker process; A's is killed mid-iteration. Only
    A ends Crashed: B goes on iterating and completes (a shared process pool used to fail B with A)."""
    job = salus_job(persistent="200MiB", ephemeral="1GiB")(iterates_until_its_neighbour_died)

    @flow(task_runner=GpuTaskRunner(pool=_pool("salus-neighbour"), admission=SalusColocation(
        policy="fair", max_jobs_per_device=2), tracking=False))
    def neighbour_killed():
        a, b = job.submit(str(tmp_path), True), job.submit(str(tmp_path), False)
        a.wait(120), b.wait(120)
        return a.state, b.state

    a, b = neighbour_killed()
    assert b.type == StateType.COMPLETED and b.result() == 3
    assert a.type == StateType.CRASHED and "SIGKILL" in a.message
    assert _pool("salus-neighbour").open_ledger().leases() == []


@salus_job(persistent="200MiB", ephemeral="1GiB")
@task
def runs_until_stopped(reclaim: bool) -> int:
    """Many short iterations; the first job takes the executor's device lease away as the ledger's reclaim
    does (another connection deletes it), and the heartbeat finds it gone."""
    for step in salus_iterations(100_000):
        if reclaim and step == 1:
            device_lease = current_placement().placement.lease_id.split("#")[0]
            db = sqlite3.connect(pool_path("salus-lost"))
            assert db.execute("DELETE FROM leases WHERE id=?", (device_lease,)).rowcount == 1
            db.commit()
            db.close()
        torch.randn(64, 64).sum()
    return step


@salus_job(persistent="200MiB", ephemeral="14.5GiB")
@task
def waits_for_a_lane() -> None:
    """Too big for FAIR's lane beside the two others: queued until the device is gone."""
    list(salus_iterations(1))


@pytest.mark.usefixtures("prefect_server")
def test_jobs_of_an_executor_that_lost_its_device_lease_end_crashed_not_hung(state_dir):
    @flow(task_runner=GpuTaskRunner(pool=_pool("salus-lost", lease_ttl_s=1.5), mode="thread",
                                    admission=SalusColocation(policy="fair"), tracking=False))
    def loses_the_device():
        futures = [runs_until_stopped.submit(True), runs_until_stopped.submit(False)]
        executor = salus_executor(flow_runner(), 0)
        deadline = time.monotonic() + 60
        while len(executor.controller.lanes.persistent) < 2 and time.monotonic() < deadline:  # both in the lane
            time.sleep(0.01)
        futures.append(waits_for_a_lane.submit())
        for f in futures:
            f.wait(60)
        return [f.state for f in futures]

    states = loses_the_device()
    assert [s.type for s in states] == [StateType.CRASHED] * 3
    assert all("lost its device lease" in s.message for s in states)
    assert _pool("salus-lost").open_ledger().leases() == []
