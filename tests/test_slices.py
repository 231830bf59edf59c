"""The slice emulation turns measured work into slice time: heavier work, longer slice time; half a
device, twice the time; nothing emulated on a real GPU."""

import pytest
import torch

from gpu.contract import contract_violations, is_frozen_decision
from gpu.ledger import Lease
from tasks.runtime.requests import TaskPlacement, placed
from tasks.runtime.slices import MPS_PIPE_ENV, enforce, mps_environment, on_slice


def _placement(fraction: float) -> TaskPlacement:
    return TaskPlacement(Lease("l1", "n0", (0,), fraction, 0), "cpu", "")


def _work(n: int) -> float:
    torch.set_num_threads(1)  # as every gpuflows task does: the thread's CPU time is the work's
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(0))
    return float((a @ a).sum())


def test_slice_time_is_measured_work_over_the_share():
    _work(200)  # torch's first matmul pays one-time set-up; measure warm work
    with placed(_placement(0.25)), on_slice() as light:
        _work(200)
    with placed(_placement(0.25)), on_slice() as heavy:
        for _ in range(8):
            _work(400)
    assert light.timing.emulated and light.timing.share == 0.25
    assert light.timing.slice_s == pytest.approx(light.timing.work_s / 0.25)
    assert heavy.timing.work_s > 4 * light.timing.work_s  # 64x the flops: the measurement sees it


def test_time_the_thread_is_kept_off_the_cpu_is_not_the_works():
    """On a simulated pool other processes taking the machine's cores (a loaded CI box) must not make a task's
    work look heavier: while the measured thread waits, here for another thread's matmuls, no work is counted."""
    import threading
    import time

    done = threading.Event()

    def others_work() -> None:
        for _ in range(3):
            _work(300)
        done.set()

    other = threading.Thread(target=others_work)
    with placed(_placement(0.5)), on_slice() as clock:
        wall = time.perf_counter()
        other.start()
        done.wait(timeout=60)
        _work(32)
        wall = time.perf_counter() - wall
    other.join()
    assert done.is_set() and clock.timing.work_s < wall / 4, (clock.timing, wall)


def test_outside_a_runner_the_work_holds_a_whole_device():
    with on_slice() as clock:
        _work(64)
    assert clock.timing.share == 1.0 and clock.timing.slice_s == clock.timing.work_s


def test_a_reused_worker_lifts_the_memory_cap_an_earlier_task_set(monkeypatch):
    """torch's per-process memory fraction outlives the task that set it: an uncapped task after a 2 GiB one on
    the same worker process must get the whole device back, not hit OOM at 2 GiB. (No GPU here: we read the
    fraction torch is told, on a 16 GiB device.)"""
    told: list[float] = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type("P", (), {"total_memory": 16 << 30}))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda fraction, dev: told.append(fraction))
    enforce(TaskPlacement(Lease("capped", "n0", (0,), 0.5, 2 << 30), "cuda:0", "0"))
    enforce(TaskPlacement(Lease("uncapped", "n0", (0,), 0.5, 0), "cuda:0", "0"))
    assert told == [0.125, 1.0]


def test_mps_share_only_where_a_daemon_listens(tmp_path, monkeypatch):
    monkeypatch.setenv(MPS_PIPE_ENV, str(tmp_path))
    assert mps_environment(0.3) == {}
    (tmp_path / "control").touch()
    assert mps_environment(0.3) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    assert mps_environment(1.0) == {}


def test_contract_checker_names_what_is_wrong():
    class Good:
        system, policy, hooks = "x", "p", ("on_round",)

        def on_round(self, now, feedback):
            return None

    class BadHook(Good):
        hooks = ("on_round", "on_lunch")

    class NoNow(Good):
        def on_round(self, feedback):
            return None

    assert contract_violations(Good()) == []
    assert "on_lunch" in contract_violations(BadHook())[0]
    assert "`now` first" in contract_violations(NoNow())[0]
    assert contract_violations(object()) and not is_frozen_decision(Good())
