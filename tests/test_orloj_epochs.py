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


@pytest.mark.slow
def test_heavier_work_mid_run_shrinks_orlojs_batch_for_that_application_in_the_next_epoch():
    """Two applications share a worker; after 2 s one application's inputs start taking all 12 layers instead
    of 1 (no configuration changes). The epoch after, the histogram the running worker's policy holds for it is
    several times longer and ORLOJ's largest batch for it shrinks; the other application's stays."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = ExitByInput().eval().requires_grad_(False)
    profile = profile_model("exit", model, repeats=5, warmup=2)  # torch.rand rows: depth 1
    light, heavy = depth_rows(1, 400), depth_rows(12, 400, seed=1)
    first = alone_times(model, {"steady": light[:40], "drifting": light[:40]})
    batch = PaddedBatchModel.from_profile(profile.latency, profile.max_batch, 0.0)
    template = make_policy("orloj", histograms=first, model=batch, mix="own_app")
    slo = 5 * template.table.means["steady", 16]  # ORLOJ forms batches of 16 of the light work
    ctl = OrlojController(template, profiler=OnlineProfiler(window_ms=999.0, min_samples=10, bins=50),
                          slo_ms={"steady": slo, "drifting": slo})
    slo_ms = max(slo, 50.0)  # deadlines the loaded machine can keep; the decision above uses ORLOJ's own SLO
    node = GpuNode(0, 10.0, tuple(SessionPlacement(s, "exit", slo_ms, 16, 50.0, 1.0, 2.0)
                                  for s in ("steady", "drifting")))
    plan = Plan("test", "paper", (node,), tuple(Session(s, "exit", slo_ms, 50.0) for s in ("steady", "drifting")))
    factory = lambda: make_policy("orloj", histograms=ctl.batch_policy.histograms, model=batch,  # noqa: E731
                                  mix="own_app")
    pool = PoolLedger(discover("1x16GiB", "simulated"))
    with LocalServingRuntime({"exit": model}, {"exit": profile}, pool, policy_factory=factory,
                             measure_batches=True) as rt:
        rt.apply(plan)
        feedback = EpochFeedback(1.0, rt.take_batches, rt.update_policies, orloj=ctl)
        worker = rt.workers[0]
        start = time.perf_counter()
        for tick in range(1, 401):  # 4 s: bursts of 1 request per application every 10 ms
            due = start + tick * 0.01
            time.sleep(max(0.0, due - time.perf_counter()))  # pacing arrivals, as the load generator does
            i = tick % 400
            rt.frontend.submit_many("steady", light[i:i + 1])
            rt.frontend.submit_many("drifting", (light if tick <= 200 else heavy)[i:i + 1])
            if tick % 100 == 0:
                feedback.on_beacon(tick / 100, rt.take_counts())
        pushed = worker.policy.histograms
    limits = [e["apps"]["drifting"]["batch_limit"] for e in feedback.orloj_epochs]
    means = [e["apps"]["drifting"]["mean_alone_ms"] for e in feedback.orloj_epochs]
    steady = [e["apps"]["steady"]["batch_limit"] for e in feedback.orloj_epochs]
    assert len(limits) == 4 and all(e["apps"]["drifting"]["reprofiled"] for e in feedback.orloj_epochs)
    assert means[2] > 3 * means[1]  # the epoch after the drift measured the heavier work
    assert limits[2] < limits[1] and steady[2] > limits[2]
    assert pushed["drifting"].mean == pytest.approx(means[3])  # the running worker holds the latest histogram
