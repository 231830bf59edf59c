"""The Cilantro flow's jobs report what they measured on their slice: steps/s grow with the share, a heavier
model answers fewer requests in time, and a job without a slice serves nothing."""

from __future__ import annotations

import numpy as np
import pytest

import tasks.cilantro.jobs as cj
from gpu.ledger import Lease
from tasks.runtime.requests import TaskPlacement, placed
from tests.heavier_work import Ensemble

WINDOW = cj.RoundWindow(0, 1.0, 0.25, 1 / 3, trace_step=1, seed=0)
SERVICE = cj.JobConfig("svc", "service", 0.9, base_load=200.0, hidden=1024, rows=256)
TRAINER = cj.JobConfig("trainer", "training", 50.0, scale_ms=2.2, hidden=1024, rows=256)


def on_share(fraction: float) -> TaskPlacement:
    return TaskPlacement(Lease("l1", "n0", (0,), fraction, 0), "cpu", "")


def test_the_slice_timeline_serves_in_arrival_order_and_stops_at_the_round_end():
    tl = cj.SliceTimeline(1, end=0.5)
    done = [tl.run(t, lambda: 0.15) for t in (0.0, 0.1, 0.2, 0.3)]
    assert done[:3] == pytest.approx([0.15, 0.3, 0.45]) and done[3] is None  # 0.6 > 0.5: missed
    calls = []
    assert tl.run(0.4, lambda: calls.append(1) or 0.1) is None and calls == []  # cannot start: not run at all
    two = cj.SliceTimeline(2, end=1.0)
    assert [two.run(0.0, lambda: 0.4) for _ in range(3)] == pytest.approx([0.4, 0.4, 0.8])


@pytest.mark.slow
def test_a_trainer_on_twice_the_share_takes_about_twice_the_measured_steps(tmp_path):
    """Each round is a fraction of a second of real SGD steps, so one stall of a busy machine (or torch's first
    backward) moves a single round's count: the rounds alternate between the shares after a warm-up round, and
    the median counts are compared."""
    steps = {0.2: [], 0.4: []}
    for i, share in enumerate((0.4, 0.2, 0.4, 0.2, 0.4, 0.2, 0.4)):  # the first: warm-up, not counted
        with placed(on_share(share)):
            out = cj.run_trainer.fn(TRAINER, WINDOW, None, str(tmp_path / f"t{i}.pt"))
        if i:
            steps[share].append(out["steps"])
        assert out["alloc"] == share and out["work_ms"] > 0 and len(out["perf"]) == WINDOW.reports
    assert 1.5 < np.median(steps[0.4]) / np.median(steps[0.2]) < 2.6, steps


@pytest.mark.slow
def test_a_heavier_model_on_the_same_share_answers_fewer_requests_within_the_slo(monkeypatch):
    """10x the work per request (an ensemble of 10 copies of the service's model): at 0.35 of the GPU the light
    model keeps the slice about 30% busy, the heavy one 300%, so no fast or slow moment of the machine (2x either
    way) lets the heavy one keep up. (A model 4x wider was 1-3x busy: on a fast moment it answered nearly all.)"""
    with placed(on_share(0.35)):
        light = cj.run_service.fn(SERVICE, WINDOW)
        real = cj.service_model
        monkeypatch.setattr(cj, "service_model", lambda job, device: Ensemble(real(job, device), 10))
        heavy = cj.run_service.fn(SERVICE, WINDOW)
    assert light["requests"] == heavy["requests"]  # the same arrivals
    assert heavy["work_ms"] > 2.5 * light["work_ms"]
    assert np.mean(heavy["perf"]) < np.mean(light["perf"]) - 0.3
    assert light["accuracy"] > 0.8


def test_a_service_without_a_slice_serves_nothing():
    out = cj.run_service.fn(SERVICE, WINDOW)  # no placement: zero GPUs
    assert out["alloc"] == 0.0 and out["served"] == 0 and max(out["perf"]) == 0.0


@pytest.mark.parametrize("field,value", [("rows", 0), ("rows", 598), ("hidden", 2.5), ("scale_ms", float("inf"))])
def test_bad_job_fields_name_the_field(field, value):
    from gpu.errors import ConfigError

    with pytest.raises(ConfigError, match=f"svc.{field}="):
        cj.JobConfig("svc", "service", 0.9, **{field: value})
