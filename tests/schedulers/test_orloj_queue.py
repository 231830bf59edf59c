"""ORLOJ's incremental queue (Alg. 4.1 with §4.4.4's lines and milestones) decides exactly as the full Eq. 4.2 scan
of ``OrlojPolicy.decide``, through arrivals, timeouts, a smaller largest batch, multi-step costs, a base-time reset
and re-profiled histograms."""

import numpy as np
import pytest

from gpu.batching import BatchContext, InferenceRequest
from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.schedulers.orloj.controller import BatchDone, OrlojController
from gpu.schedulers.orloj.policy import Histogram, OrlojPolicy
from gpu.schedulers.orloj.queue import OrlojQueue


def histograms(rng, shift=0.0):
    return {"short": Histogram.from_samples(np.clip(rng.normal(50 + shift, 10, 2000), 1, None)),
            "long": Histogram.from_samples(np.clip(rng.normal(100 + shift, 10, 2000), 1, None))}


def replay(policy: OrlojPolicy, seed: int, steps: int = 120, reprofile_at: int | None = None) -> int:
    """Feed one random stream to the queue and to the scan; return how many decisions were compared."""
    rng = np.random.default_rng(seed)
    queue, scan = OrlojQueue(policy), []
    now, rid, compared = 0.0, 0, 0
    for step in range(steps):
        if step == reprofile_at:
            policy.update_histograms(histograms(rng, shift=40.0))  # the profiler published: both follow
        burst = []
        for _ in range(int(rng.integers(0, 12))):
            burst.append(InferenceRequest(rid, ["short", "long"][int(rng.integers(2))], now, now + rng.uniform(50, 800)))
            rid += 1
        queue.add(burst)
        scan += burst
        largest = int(rng.choice([16, 16, 8, 4]))
        want = policy.decide(scan, BatchContext(now, lambda b: 1.0, 1, largest))
        run, dropped = queue.decide(now, largest)
        assert {r.request_id for r in run} == {scan[i].request_id for i in want.run}, f"step {step}"
        assert {r.request_id for r in dropped} == {scan[i].request_id for i in want.drop}, f"step {step}"
        gone = {r.request_id for r in run + dropped}
        scan = [r for r in scan if r.request_id not in gone]
        assert sorted(r.request_id for r in queue.requests) == sorted(r.request_id for r in scan)
        compared += bool(run or dropped)
        now += rng.uniform(5, 120)
    return compared


@pytest.mark.parametrize("mix", ["round_robin", "iid", "request_aware", "own_app"])
def test_the_queue_decides_as_the_scan_for_every_mix(mix):
    rng = np.random.default_rng(7)
    model = PaddedBatchModel(2.0, tuple(np.linspace(1.0, 1.5, 16)), tuple(np.linspace(1.0, 1.2, 16)))
    assert replay(OrlojPolicy(histograms(rng), model, mix=mix), seed=1) > 60


def test_multi_step_costs_a_base_time_reset_and_new_histograms_change_nothing():
    """b = 0.02/ms resets the base time every 5 s (b·t > 100): every line is recomputed then."""
    rng = np.random.default_rng(8)
    policy = OrlojPolicy(histograms(rng), PaddedBatchModel(2.0), cost_steps=((0.0, 1.0), (50.0, 3.0)), b=0.02)
    assert replay(policy, seed=2, reprofile_at=60) > 60


def test_the_controller_keeps_an_orloj_queue_and_a_list_for_other_policies():
    rng = np.random.default_rng(9)
    policy = OrlojPolicy(histograms(rng), PaddedBatchModel(2.0))
    ctrl = OrlojController(policy, lambda now: BatchContext(now, lambda b: 1.0, 1, 16))
    burst = [InferenceRequest(i, "short", 0.0, 5000.0) for i in range(40)]
    first = ctrl.on_arrival(0.0, burst)  # a burst arrives at once: the decision sees all of it
    assert len(first.run) == 16 and len(ctrl.queue) == 24
    assert ctrl.on_arrival(1.0, InferenceRequest(99, "long", 1.0, 5000.0)).run == ()  # busy
    nxt = ctrl.on_job_done(80.0, BatchDone(0.0, 75.0))
    assert len(nxt.run) == 16 and len(ctrl.queue) == 9
