"""The ORLOJ worker loop as a contract controller: hooks take ``now`` first and return frozen dispatches."""

from gpu.batching import BatchContext, InferenceRequest
from gpu.systems import make_batch_policy as make_policy
from gpu.contract import contract_violations, is_frozen_decision
from gpu.schedulers.orloj.policy import Histogram
from gpu.schedulers.orloj.controller import BatchDone, OrlojController
from gpu.schedulers.orloj.profiler import OnlineProfiler


def context(now):
    return BatchContext(now, lambda b: 40.0 * b, 1, 16)


def test_the_controller_follows_the_contract():
    ctrl = OrlojController(make_policy("clipper"), context)
    assert contract_violations(ctrl) == [] and ctrl.system == "orloj" and ctrl.policy == "clipper"
    assert is_frozen_decision(ctrl.on_wake(0.0))


def test_one_batch_at_a_time_and_the_next_when_it_finishes():
    ctrl = OrlojController(make_policy("clipper"), context)
    r1, r2, r3 = (InferenceRequest(i, "a", float(i), 500.0) for i in range(3))
    assert ctrl.on_arrival(0.0, r1).run == (r1,)
    assert ctrl.on_arrival(1.0, r2).run == () and ctrl.on_arrival(2.0, r3).run == ()
    nxt = ctrl.on_job_done(40.0, BatchDone(0.0))
    assert nxt.run == (r2, r3)  # Clipper's AIMD grew to 2 after a batch within the SLO (observe)
    assert ctrl.queue == [] and ctrl.running == (r2, r3)


def test_sampled_requests_timed_alone_reach_orloj_at_the_next_epoch():
    """§4.3.2: a finished request is sent to be timed alone; ORLOJ adopts its measurement at the epoch's end,
    not before (the same ``on_epoch`` the serving rollout calls with its workers' batches)."""
    policy = make_policy("orloj", histograms={"a": Histogram([10, 20], [1])})
    ctrl = OrlojController(policy, context, OnlineProfiler(sample_rate=1.0, min_samples=1), slo_ms={"a": 100.0})
    reqs = [InferenceRequest(i, "a", 0.0, 10_000.0) for i in range(3)]
    assert ctrl.on_arrival(0.0, reqs[0]).run == (reqs[0],)
    for r in reqs[1:]:
        ctrl.on_arrival(1.0, r)
    first = ctrl.on_job_done(15.0, BatchDone(0.0))
    assert first.profile == (0,) and set(first.run) == {reqs[1], reqs[2]}
    ctrl.on_job_done(45.0, BatchDone(15.0))
    assert policy.table.means[None, 1] == 15.0  # nothing adopted between epochs
    decision = ctrl.on_epoch(50.0, {"a": [(1, 50.0)]})  # the world timed request 0 alone: 50 ms
    assert abs(policy.table.means[None, 1] - 50.0) < 0.1
    assert dict(decision.histograms)["a"].mean == policy.histograms["a"].mean
    assert decision.limit("a") == 2  # Eq. 4.3 with c0 = 0: two padded 50-ms requests fill the 100-ms SLO
