"""Salus jobs that declare no memory are profiled over their first iterations with what torch really allocates
(thesis Observation 2; Alg. 2.1 then admits them with the measured sizes), on the CPU."""

from __future__ import annotations

import threading

import pytest
import torch

from gpu.errors import ConfigError, NeverFitsError
from gpu.schedulers.salus.controller import Profiled, SalusController, SalusJob
from tasks.salus.executor import SalusExecutor, Undeclared, declared_job, salus_iterations, salus_job
from tasks.salus.placement import Lane

torch.set_num_threads(1)
DEVICE_MB = 1300  # 1000 MB usable after the 300 MB reserve


def _train_mlp(lane: Lane, width: int, iterations: int, profiled: threading.Event,
               go_on: threading.Event) -> None:
    """A real trainer whose persistent memory grows with ``width`` (weights, gradients, Adam's two moments)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.ReLU(), torch.nn.Linear(width, 1024))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024)
    for step in salus_iterations(iterations, lane):
        if step == lane.profile_iterations:  # the first iteration after re-admission
            profiled.set()
            go_on.wait(60)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def _profile_then_admit_beside(width: int) -> tuple[tuple[float, float], Lane, Lane | None]:
    """Profile a job of ``width`` alone on the device, then ask for a declared job that needs 950 of the 1000
    usable MB beside it: its lane, or None if Alg. 2.1 queued it (not admitted within a short wait)."""
    with SalusExecutor(None, 0, capacity_mb=DEVICE_MB, policy="pack", lease=False) as ex:
        lane = ex.admit(Undeclared("x"))
        assert lane.profile_iterations == 2 and lane.memory_cap >= 999 * 2 ** 20  # alone on the device
        profiled, go_on = threading.Event(), threading.Event()
        job = threading.Thread(target=_train_mlp, args=(lane, width, 4, profiled, go_on))
        job.start()
        try:
            assert profiled.wait(120)
            big = SalusJob("big", 10, (1000 - 50 - 10 * 1.155) / 1.05, on_demand=True)
            try:
                beside = ex.admit(big, timeout=0.5)
            except TimeoutError:
                beside = None
            with ex._lock:
                readmitted = ex._lane("x", ex._jobs["x"])
        finally:
            go_on.set()
            job.join(120)
            ex.leave("x")
        return ex.profiles["x"], readmitted, beside


def test_a_four_times_wider_model_is_profiled_larger_and_keeps_the_next_job_queued():
    (p_narrow, e_narrow), narrow, beside_narrow = _profile_then_admit_beside(512)
    (p_wide, e_wide), wide, beside_wide = _profile_then_admit_beside(2048)
    assert 2.5 * p_narrow < p_wide < 6 * p_narrow and e_narrow > 0 and e_wide > e_narrow
    assert 10 < p_narrow < 40  # ~4 MB of weights x (1 + grad + 2 Adam moments) + the 1 MB input
    assert narrow.memory_cap < wide.memory_cap < 200 * 2 ** 20  # re-admitted with measured, not whole-device sizes
    assert beside_narrow is not None and beside_narrow.lane_id != narrow.lane_id  # Alg. 2.1: a new lane beside it
    assert beside_wide is None  # the measured wide job leaves too little: Alg. 2.1 "not found", queued


def test_a_job_declares_both_sizes_or_neither():
    @salus_job(expected_s=3, profile_iterations=3)
    def undeclared():
        pass

    job = declared_job(undeclared, "u")
    assert isinstance(job, Undeclared) and (job.expected_s, job.profile_iterations) == (3, 3)
    with pytest.raises(ConfigError, match="persistent only"):
        salus_job(persistent="1GiB")
    with pytest.raises(ConfigError, match="profile_iterations"):
        salus_job(profile_iterations=0)


def test_a_profiled_job_is_readmitted_before_a_shorter_job_that_queued_behind_its_profiling():
    """Its memory is resident already: under SRTF the shorter queued job would otherwise take the lane first."""
    ctl = SalusController(DEVICE_MB, "srtf")
    ctl.on_arrival(0.0, SalusJob("x", 1.0, (1000 - 1.155) / 1.05, expected_s=100, on_demand=True))
    assert ctl.on_arrival(1.0, SalusJob("y", 10, 900, expected_s=1, on_demand=True)).queued == ("y",)
    step = ctl.on_arrival(2.0, Profiled("x", 100, 100))
    assert [a.job_id for a in step.admitted] == ["x"] and ctl.queue == ("y",)
    assert ctl.lanes.persistent["x"] == pytest.approx(115.5)
    with pytest.raises(NeverFitsError, match="job x"):
        ctl.on_arrival(3.0, Profiled("x", 900, 900))
