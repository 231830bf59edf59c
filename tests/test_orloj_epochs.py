"""ORLOJ every epoch of a serving rollout: the batches the workers ran become the next histograms (thesis §4.3.2),
pushed to the running workers; the inversion of Eq. 4.3/4.6 behind it; a drift to heavier real work changes
the batch ORLOJ forms for that application in the next epoch."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.systems import make_batch_policy as make_policy
from gpu.devices import discover
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger
from gpu.schedulers.nexus.squishy import GpuNode, Plan, Session, SessionPlacement
from gpu.schedulers.orloj.controller import OrlojController
from gpu.schedulers.orloj.policy import Histogram
from gpu.schedulers.orloj.profiler import OnlineProfiler, histogram_from_maxima, longest_alone_ms
from tasks.serving.dynamic_models import ExitByInput, alone_times, depth_rows
from tasks.serving.epochs import EpochFeedback
from tasks.serving.models import profile_model
from tasks.serving.runtime import LocalServingRuntime


def test_a_batch_time_gives_back_its_slowest_requests_alone_time():
    model = PaddedBatchModel(1.0)
    assert longest_alone_ms(model.batch_ms([2.0, 3.0, 2.5, 1.5]), 4, model) == pytest.approx(3.0)
    assert longest_alone_ms(0.5, 4, model) == pytest.approx(0.875)  # below c0: never negative


def test_maxima_of_batches_of_k_recover_the_per_request_distribution():
    """The longest of k draws has CDF F^k (Eq. 4.6): inverting it recovers F's mean and P90, not the maxima's."""
    rng = np.random.default_rng(0)
    alone = rng.uniform(10.0, 20.0, (4000, 4))
    h = histogram_from_maxima({1: alone[:1000, 0], 4: alone[1000:].max(1)}, bins=50)
    assert h.mean == pytest.approx(15.0, abs=0.4) and h.quantile(0.9) == pytest.approx(19.0, abs=0.4)
    assert Histogram.from_samples(alone[1000:].max(1)).mean > 17.5  # the maxima themselves are longer


def test_on_epoch_refuses_a_controller_without_a_profiler():
    policy = make_policy("orloj", histograms={"a": Histogram([1.0, 2.0], [1])})
    with pytest.raises(ConfigError) as err:
        OrlojController(policy).on_epoch(0.0, {"a": [(1, 1.5)]})
    assert err.value.field == "batch_policy"


def test_the_profiler_keeps_a_batch_size_with_each_measurement():
    prof = OnlineProfiler(min_samples=2, bins=10)
    prof.record(0.0, "a", 4.0, batch=4)
    prof.record(0.0, "a", 4.0, batch=4)
    assert set(prof.publish(0.0)) == {"a"}
    with pytest.raises(ConfigError) as err:
        prof.record(0.0, "a", 1.0, batch=0)
    assert err.value.field == "batch"


REQUESTS = 60  # per application and epoch, each served alone: 60 measured batches apiece, on any machine


@pytest.mark.slow
def test_heavier_work_mid_run_shrinks_orlojs_batch_for_that_application_in_the_next_epoch():
    """Two applications share a worker; in the second epoch one application's inputs take all 48 layers of an
    early-exit model instead of 1 (48× the layers, no configuration changed). The epoch after, the histogram the
    running worker's policy holds for it is many times longer and ORLOJ drops its requests (they can no longer
    meet the SLO even alone), while the other application keeps its batches.

    The test controls what is measured: each request is submitted when the worker is idle, so the frontend's
    thread serves it at once as a batch of one (``run_inline``) and every epoch measures exactly ``REQUESTS``
    batches per application; a batch's measure on the CPU is its thread CPU time, which other processes on the
    cores do not lengthen; epochs end when the test says, not on a wall clock. The SLO comes from a first epoch of
    light work measured the same way (6× its mean alone time), so it scales with the machine: light work meets it
    alone until it measures 6× slower (a loaded machine moved one epoch's light mean 2.2×), heavy work misses it
    even alone unless its 48 layers of width 768 measure under 6 light requests (they measured 30-100). Each
    epoch serves the steady application's requests before the drifting one's: light work right behind heavy work,
    which evicts its weights from the cache, measured 2.8× slower on an idle machine and 16× under four busy
    loops, which is the cache's doing, not the workload's. Margins: about 5× each way; limits compared, not
    timed."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = ExitByInput(width=768, layers=48).eval().requires_grad_(False)
    profile = profile_model("exit", model, repeats=5, warmup=2)  # torch.rand rows: depth 1
    light, heavy = depth_rows(1, REQUESTS), depth_rows(48, REQUESTS, seed=1)
    first = alone_times(model, {"steady": light[:40], "drifting": light[:40]})
    batch = PaddedBatchModel.from_profile(profile.latency, profile.max_batch, 0.0)
    template = make_policy("orloj", histograms=first, model=batch, mix="own_app")
    ctl = OrlojController(template, profiler=OnlineProfiler(window_ms=999.0, min_samples=10, bins=50),
                          slo_ms={"steady": 1.0, "drifting": 1.0})
    slo_ms = 60_000.0  # the requests' deadlines: none is dropped however long the machine stalls a batch
    node = GpuNode(0, 10.0, (SessionPlacement("s", "exit", slo_ms, 16, 50.0, 1.0, 2.0),))
    plan = Plan("test", "paper", (node,), (Session("s", "exit", slo_ms, 50.0),))
    factory = lambda: make_policy("orloj", histograms=ctl.batch_policy.histograms, model=batch,  # noqa: E731
                                  mix="own_app")
    pool = PoolLedger(discover("1x16GiB", "simulated"))
    with LocalServingRuntime({"exit": model}, {"exit": profile}, pool, policy_factory=factory,
                             apps={"steady": None, "drifting": None}, measure_batches="cpu") as rt:
        rt.apply(plan)
        feedback = EpochFeedback(1.0, rt.take_batches, rt.update_policies, orloj=ctl)
        worker = rt.workers[0]
        served = 0
        for epoch in (0, 1, 2, 3):
            drifted = heavy if epoch >= 2 else light
            for app, rows in (("steady", light), ("drifting", drifted)):  # one app's requests, then the other's
                for i in range(REQUESTS):
                    rt.frontend.submit("s", rows[i], app=app)
                    served += 1
                    while len(rt.recorder.outcomes) < served:  # served inline already; a stalled frontend waits
                        time.sleep(0.001)
            feedback.epoch(float(epoch))
            if epoch == 0:  # the SLO: 6× the light work's mean alone time as this machine runs it
                slo = 6 * ctl.batch_policy.table.means["steady", 1]
                ctl.slo_ms = {"steady": slo, "drifting": slo}
        pushed = worker.policy.histograms
    rows = feedback.orloj_epochs[1:]
    assert [e["apps"][a]["batches"] for e in rows for a in ("steady", "drifting")] == [REQUESTS] * 6
    assert all(o.batch == 1 for o in rt.recorder.outcomes)
    means = [e["apps"]["drifting"]["mean_alone_ms"] for e in rows]
    limits = [e["apps"]["drifting"]["batch_limit"] for e in rows]
    steady = [e["apps"]["steady"]["batch_limit"] for e in rows]
    assert means[1] > 3 * means[0], rows  # the epoch after the drift measured the heavier work
    assert limits[0] >= 1 and limits[1] == 0 and steady[1] >= 1, rows  # it can no longer meet the SLO even alone
    assert pushed["drifting"].mean == pytest.approx(means[2])  # the running worker holds the latest histogram
