"""The Nexus serving runtime on real tiny torch models: latency under SLO at low load, early drops under
overload, every batch policy (and any BatchPolicy object) in the worker, DRR routing by rate shares,
incremental re-plans that give leases back, and the profiler feeding the planner."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from gpu.batching import BatchDecision
from gpu.schedulers.nexus.batching import EarlyDropPolicy
from gpu.systems import make_batch_policy as make_policy
from gpu.devices import discover
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session, SquishyPacker
from gpu.schedulers.nexus.routing import DeficitRoundRobin, WeightedRandom
from tasks.serving.frontend import Frontend
from tasks.serving.loadgen import LoadGenerator, RatePhase, RateTrace
from tasks.serving.models import accuracy, load_digits_tensors, load_or_train, profile_model
from tasks.serving.runtime import LocalServingRuntime, lease_share
from tasks.serving.stats import Recorder
from tasks.serving.worker import ServingWorker

MODELS = ("digits_mlp", "digits_cnn_small")


@pytest.fixture(scope="module")
def served():
    torch.set_num_threads(1)
    data = load_digits_tensors()
    models = {m: load_or_train(m, steps=60) for m in MODELS}
    profiles = {m: profile_model(m, models[m], repeats=5, warmup=2) for m in MODELS}
    return data, models, profiles


def ledger() -> PoolLedger:
    return PoolLedger(discover("2x16GiB", "simulated"))


def one_node_plan(session: Session, batch: int, profiles) -> Plan:
    p = profiles[session.model]
    node = GpuNode(0, 10.0, (SessionPlacement(session.session_id, session.model, session.slo_ms, batch, session.rate,
                                       p.latency(batch), 10.0 + p.latency(batch)),))
    return Plan("test", "paper", (node,), (session,))


def wait_until_idle(worker: ServingWorker, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while worker.queued() and time.monotonic() < end:
        time.sleep(0.01)


def test_profiles_of_our_models_are_contiguous_and_plannable(served):
    _, models, profiles = served
    for m, p in profiles.items():
        assert p.batches == tuple(range(1, 65)) and all(v > 0 for v in p.latency_ms)
    assert accuracy(models["digits_mlp"], served[0]) > 0.8
    plan = SquishyPacker(profiles).plan([Session("a", "digits_mlp", 50, 200), Session("b", "digits_cnn_small", 50, 100)])
    assert plan.violations() == [] and {p.session_id for n in plan.nodes for p in n.placements} == {"a", "b"}


@pytest.mark.parametrize("busy_ms,duty_ms,saturated,share", [
    (3.1, 10.0, False, 0.35),   # occupancy 0.31 rounds up to the next 0.05
    (0.1, 10.0, False, 0.05),   # a nearly idle node still takes the smallest slice
    (5.0, 10.0, False, 0.50),   # on the grid: no extra step
    (9.9, 10.0, False, 1.00),
    (3.0, 10.0, True, 1.00),    # a saturated node takes the whole GPU whatever its occupancy
])
def test_a_node_leases_its_occupancy_rounded_up_to_the_share_step(busy_ms, duty_ms, saturated, share):
    node = GpuNode(0, duty_ms, (SessionPlacement("s", "m", 100.0, 1, 10.0, busy_ms, 100.0),), saturated)
    assert lease_share(node) == pytest.approx(share)


def test_real_model_meets_its_slo_at_low_load(served):
    data, models, profiles = served
    s = Session("mlp", "digits_mlp", 100.0, 100.0)
    plan = SquishyPacker(profiles).plan([s])
    pool = ledger()
    with LocalServingRuntime(models, profiles, pool) as rt:
        rt.apply(plan)
        assert [p.fraction for p in pool.leases()] == [lease_share(plan.nodes[0])]
        load = LoadGenerator(rt.frontend.submit, RateTrace.constant({"mlp": 100.0}, 1.5), data.x_test,
                             data.y_test).run()
    assert pool.leases() == []
    w = rt.recorder.window(labels=load.labels)
    assert w.offered == load.sent > 100
    assert w.slo_attainment >= 0.9 and w.p50_latency_ms < s.slo_ms
    assert w.accuracy > 0.8
    o = rt.overhead()  # every request and the worker's busy time are accounted, the model's time apart
    assert o["requests"] == load.sent and o["frontend_us_per_request"] > 0 and o["worker_us_per_request"] > 0
    assert o["batch1_execute_us"] > 0


def test_a_burst_submitted_together_is_served_in_batches_and_handed_back(served):
    data, models, profiles = served
    plan = one_node_plan(Session("mlp", "digits_mlp", 5000.0, 100.0), 16, profiles)
    rec = Recorder()
    worker = ServingWorker(plan.nodes[0], models, profiles, EarlyDropPolicy(), rec)
    front = Frontend(rec)
    front.set_plan(plan, {0: worker})
    ids = front.submit_many("mlp", list(data.x_test[:64].split(1)))
    worker.start()
    wait_until_idle(worker)
    worker.stop()
    assert worker.batches == 4 and worker.served == 64
    got = rec.take()
    assert [o.request_id for o in got] == list(ids) and rec.outcomes == []
    correct = sum(o.pred == int(y) for o, y in zip(got, data.y_test[:64]))
    assert correct > 0.8 * 64


class _Slow(torch.nn.Module):
    """A model whose forward also busy-waits ``ms`` (a stand-in for a slow GPU kernel)."""

    def __init__(self, inner: torch.nn.Module, ms: float):
        super().__init__()
        self.inner, self.ns = inner, int(ms * 1e6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.perf_counter_ns() + self.ns
        while time.perf_counter_ns() < end:
            pass
        return self.inner(x)


def test_requests_due_while_the_frontend_runs_a_batch_count_that_wait(served):
    data, models, profiles = served
    plan = one_node_plan(Session("mlp", "digits_mlp", 5000.0, 2000.0), 8, profiles)
    with LocalServingRuntime({"digits_mlp": _Slow(models["digits_mlp"], 3.0)}, profiles, ledger()) as rt:
        rt.apply(plan)
        worker, front = rt.workers[0], rt.frontend
        end = time.monotonic() + 10
        while not worker._idle and time.monotonic() < end:  # the worker thread is parked on its doorbell
            time.sleep(0.001)
        handed: dict[int, int] = {}  # request id → when the load generator handed it to the frontend

        def submit(sid, x, arrival_ns):
            now = time.perf_counter_ns()
            rid = front.submit(sid, x, arrival_ns)
            handed[rid] = now
            return rid

        def submit_many(sid, xs, arrival_ns):
            now = time.perf_counter_ns()
            ids = front.submit_many(sid, xs, arrival_ns)
            handed.update(dict.fromkeys(ids, now))
            return ids

        trace = RateTrace.constant({"mlp": 2000.0}, 0.03)  # every 0.5 ms, while a batch takes 3 ms
        load = LoadGenerator(submit, trace, data.x_test, data.y_test, 0, submit_many).run()
    assert worker.inline_batches > 0  # the load generator's thread ran batches for the idle worker
    got = {o.request_id: o for o in rt.recorder.outcomes}
    assert len(got) == load.sent == len(handed) and all(o.batch for o in got.values())
    scheduled = round(load.start_ms * 1e6) + np.round(trace.arrivals(0)[0] * 1e9).astype(np.int64)
    ids = sorted(got)
    arrival = np.array([round(got[i].arrival_ms * 1e6) for i in ids])
    assert np.abs(arrival - scheduled).max() < 1000  # stamped with the schedule (ns, up to the ms float)
    waited = np.array([handed[i] for i in ids]) - scheduled  # due, but the frontend was busy with a batch
    assert waited.max() > 2e6 and load.calls < load.sent  # ... and they went over in bursts
    latency = np.array([(got[i].finish_ms - got[i].arrival_ms) * 1e6 for i in ids])
    assert (latency >= waited - 1000).all()  # that wait is part of every request's latency


class _Broken(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("model failed")


@pytest.mark.parametrize("inline", [True, False])
def test_a_failing_model_stops_the_worker_and_its_requests_count_as_dropped(served, inline):
    data, _, profiles = served
    plan = one_node_plan(Session("mlp", "digits_mlp", 5000.0, 10.0), 2, profiles)
    rec = Recorder()
    worker = ServingWorker(plan.nodes[0], {"digits_mlp": _Broken()}, profiles, EarlyDropPolicy(), rec,
                           run_inline=inline).start()
    front = Frontend(rec)
    front.set_plan(plan, {0: worker})
    end = time.monotonic() + 10
    while not worker._idle and time.monotonic() < end:  # parked: the first push runs inline (or rings)
        time.sleep(0.001)
    for i in range(5):
        front.submit("mlp", data.x_test[i])
    with pytest.raises(RuntimeError, match="model failed"):
        worker.stop()
    w = rec.window()
    assert (w.offered, w.dropped, w.good) == (5, 5, 0) and worker.inline_batches == 0


def test_overload_is_dropped_early_and_every_request_is_accounted_for(served):
    data, models, profiles = served
    slo = 50.0
    n = int(8 * slo / profiles["digits_cnn_small"].latency(1))  # 8x what batch-1 execution fits in the SLO
    s = Session("cnn", "digits_cnn_small", slo, 1000.0)
    plan = one_node_plan(s, 1, profiles)
    rec = Recorder()
    worker = ServingWorker(plan.nodes[0], models, profiles, EarlyDropPolicy(), rec).start()
    front = Frontend(rec)
    front.set_plan(plan, {0: worker})
    arrived = time.perf_counter_ns()  # a burst arrives at once: the queue is 8x what the SLO lets batch 1 serve
    for i in range(n):
        front.submit("cnn", data.x_test[i % len(data.x_test)], arrived)
    wait_until_idle(worker)
    worker.stop()
    w = rec.window()
    assert w.offered == n == w.good + w.late + w.dropped
    assert w.dropped > n / 2 and w.good > 0
    # hopeless requests are dropped, not served late: the served ones run at the edge of their deadlines (a
    # backlog), so only a forward stretched past the profiled ℓ(1) by CPU contention ends late
    assert w.late < 0.1 * w.dropped


@pytest.mark.parametrize("policy", ["early_drop", "lazy_drop", "fixed_batch"])
def test_worker_serves_a_queue_with_each_batch_policy(served, policy):
    data, models, profiles = served
    s = Session("mlp", "digits_mlp", 5000.0, 100.0)
    plan = one_node_plan(s, 8, profiles)
    rec = Recorder()
    worker = ServingWorker(plan.nodes[0], models, profiles, make_policy(policy), rec)
    front = Frontend(rec)
    front.set_plan(plan, {0: worker})
    for i in range(64):
        front.submit("mlp", data.x_test[i])
    worker.start()
    wait_until_idle(worker)
    worker.stop()
    w = rec.window()
    assert (w.offered, w.good, w.dropped) == (64, 64, 0)
    assert worker.batches == 8 and w.mean_batch == 8  # the plan's batch, taken from a full queue


def test_worker_takes_any_batch_policy_object(served):
    data, models, profiles = served

    @dataclass(frozen=True)
    class NewestFirst:  # e.g. what ORLOJ plugs in: any name + decide(queue, ctx)
        name: str = "newest_first"

        def decide(self, queue, ctx):
            return BatchDecision(run=(len(queue) - 1,)) if queue else BatchDecision()

    plan = one_node_plan(Session("mlp", "digits_mlp", 5000.0, 10.0), 1, profiles)
    rec = Recorder()
    worker = ServingWorker(plan.nodes[0], models, profiles, NewestFirst(), rec)
    front = Frontend(rec)
    front.set_plan(plan, {0: worker})
    ids = [front.submit("mlp", data.x_test[i]) for i in range(5)]
    worker.start()
    wait_until_idle(worker)
    worker.stop()
    assert [o.request_id for o in rec.outcomes] == ids[::-1]
    with pytest.raises(ConfigError, match="batch_policy"):
        ServingWorker(plan.nodes[0], models, profiles, object(), rec)


def test_a_span_policy_sees_the_queue_as_columns_and_its_span_is_what_runs(served):
    data, models, profiles = served
    seen: list[list[int]] = []

    @dataclass(frozen=True)
    class DropOddHead:  # a SpanPolicy: decides from per-request columns (as ORLOJ would from an app column)
        name: str = "drop_odd_head"

        def decide(self, queue, ctx):  # the object API is not used by the worker for a span policy
            raise AssertionError("span policies are called through decide_span")

        def decide_span(self, deadlines, now, latency, target_batch, max_batch, post=0, columns=None):
            ids = columns["request_id"]
            seen.append(ids.tolist())
            assert (columns["arrival"] <= now).all() and (deadlines > columns["arrival"]).all()
            drop = int(ids[0] % 2)
            return drop, min(3, len(ids) - drop), None

    plan = one_node_plan(Session("mlp", "digits_mlp", 5000.0, 10.0), 3, profiles)
    rec = Recorder()
    worker = ServingWorker(plan.nodes[0], models, profiles, DropOddHead(), rec)
    front = Frontend(rec)
    front.set_plan(plan, {0: worker})
    ids = front.submit_many("mlp", data.x_test[:10])
    with torch.inference_mode():
        while worker.run_once()[0]:
            pass
    assert seen[0] == list(ids)
    assert seen[1:] == [list(ids[3:]), list(ids[7:])]
    assert [o.request_id for o in rec.outcomes if o.batch] == [0, 1, 2, 4, 5, 6, 8, 9] and worker.batches == 3
    assert [o.request_id for o in rec.outcomes if not o.batch] == [3, 7]  # the odd heads, dropped


def test_ring_keeps_request_order_across_growth_and_compaction():
    from tasks.serving.ring import RequestRing

    ring = RequestRing(capacity=8)
    got: list[int] = []
    for k in range(40):
        ids = np.arange(3 * k, 3 * k + 3)
        ring.push(int(ids[0]), k, k + 100, np.repeat(ids[:, None], 64, axis=1).astype(np.float32))
        if k % 3 == 0:  # the consumer takes five (or what there is), compacting past half the capacity
            if ring.head >= ring.capacity >> 1:
                ring.compact()
            e = min(ring.tail, ring.head + 5)
            taken = ring.request_id[ring.head:e].tolist()
            assert ring.inputs(ring.head, e)[:, 0].tolist() == taken  # each input row stayed with its request
            got += taken
            ring.head = e
    got += ring.request_id[ring.head:ring.tail].tolist()
    assert got == list(range(120)) and ring.capacity <= 128


class _Sink:
    def __init__(self):
        self.n = 0
        self.ids: list[int] = []

    def push(self, session_id, ids, arrival_ns, deadline_ns, xs):
        ids = list(range(ids, ids + len(xs))) if isinstance(ids, int) else ids.tolist()
        assert len(ids) == len(xs) and deadline_ns - arrival_ns == 100_000_000  # the session's SLO, in ns
        self.n += len(ids)
        self.ids += ids


def test_frontend_routes_by_rate_shares():
    s = Session("s", "m", 100.0, 150.0)
    nodes = tuple(GpuNode(i, 10.0, (SessionPlacement("s", "m", 100.0, 1, r, 1.0, 11.0),)) for i, r in ((0, 100.0), (1, 50.0)))
    plan = Plan("test", "paper", nodes, (s,))
    sinks = {0: _Sink(), 1: _Sink()}
    front = Frontend(Recorder(), "drr")
    front.set_plan(plan, sinks)
    for _ in range(300):
        front.submit("s", np.zeros(4, np.float32))
    assert (sinks[0].n, sinks[1].n) == (200, 100)
    assert front.take_counts() == {"s": 300} and front.take_counts() == {"s": 0}
    drr = DeficitRoundRobin(["a", "b", "c"], [100, 50, 25])
    picks = np.concatenate([drr.pick_many(1) for _ in range(350)] + [drr.pick_many(350)])
    assert np.bincount(picks).tolist() == [400, 200, 100]
    wr = WeightedRandom(["a", "b"], [2, 1], np.random.default_rng(0), block=1000)
    picks = np.concatenate([wr.pick_many(k) for k in (1, 999, 1, 2999, 6000)])  # across block boundaries
    assert len(picks) == 10_000 and abs((picks == 0).mean() - 2 / 3) < 0.05
    with pytest.raises(ConfigError, match="session_id='nope'"):
        front.submit("nope", np.zeros(4, np.float32))


@pytest.mark.parametrize("balancer", ["drr", "weighted_random"])
def test_frontend_submit_many_routes_a_burst_by_rate_shares(balancer):
    s = Session("s", "m", 100.0, 150.0)
    nodes = tuple(GpuNode(i, 10.0, (SessionPlacement("s", "m", 100.0, 1, r, 1.0, 11.0),)) for i, r in ((0, 100.0), (1, 50.0)))
    sinks = {0: _Sink(), 1: _Sink()}
    front = Frontend(Recorder(), balancer, seed=3)
    front.set_plan(Plan("test", "paper", nodes, (s,)), sinks)
    first = front.submit("s", np.zeros(4, np.float32))
    ids = front.submit_many("s", np.zeros((3000, 4), np.float32))
    assert list(ids) == list(range(first + 1, first + 3001))
    assert sorted(sinks[0].ids + sinks[1].ids) == [first, *ids]
    assert abs(sinks[0].n / 3001 - 2 / 3) < 0.03
    assert front.take_counts() == {"s": 3001} and front.submitted == 3001


def test_replan_keeps_kept_nodes_and_gives_removed_leases_back(served):
    data, models, profiles = served
    a, b = Session("a", "digits_mlp", 5000.0, 50.0), Session("b", "digits_cnn_small", 5000.0, 50.0)
    two = Plan("test", "paper", (one_node_plan(a, 2, profiles).nodes[0],
                                 GpuNode(1, 10.0, one_node_plan(b, 2, profiles).nodes[0].placements)), (a, b))
    one = Plan("test", "paper", (GpuNode(0, 10.0, two.nodes[0].placements + two.nodes[1].placements),), (a, b))
    pool = ledger()
    with LocalServingRuntime(models, profiles, pool) as rt:
        rt.apply(two)
        first = rt.workers[0]
        assert len(pool.leases()) == 2
        rt.apply(one)
        assert rt.workers[0] is first and sorted(first.sessions) == ["a", "b"] and len(pool.leases()) == 1
        for i in range(20):
            rt.frontend.submit("b" if i % 2 else "a", data.x_test[i])
    assert pool.leases() == []
    w = rt.recorder.window()
    assert w.offered == 20 == w.good


def test_trace_changes_rates_between_phases():
    trace = RateTrace((RatePhase(0.0, {"a": 100.0}), RatePhase(5.0, {"a": 400.0})), 10.0)
    times, who = trace.arrivals(seed=1)
    assert set(who) == {"a"}
    first, second = (times < 5).sum(), (times >= 5).sum()
    assert 400 < first < 600 and 1800 < second < 2200
    assert trace.rates_at(7.0) == {"a": 400.0}
    with pytest.raises(ConfigError, match=r"trace.rates.a"):
        RatePhase(0.0, {"a": -1.0})


def test_unknown_serving_backend_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="backend='k8s'"):
        LocalServingRuntime({}, {}, PoolLedger(discover("1x16GiB", "simulated")), backend="k8s")


def test_a_plan_capped_at_the_pool_serves_its_unassigned_load_on_the_gpus_it_has(served):
    data, models, _ = served
    # the planner believes the MLP is a slow model (5 ms + 1 ms per input): 2 sessions need 3 GPUs, the pool has 1
    from gpu.schedulers.nexus.profiles import linear_profile

    slow = {"digits_mlp": linear_profile("digits_mlp", 1.0, 5.0, 64)}
    sessions = [Session("a", "digits_mlp", 100.0, 1500.0), Session("b", "digits_mlp", 100.0, 600.0)]
    plan = SquishyPacker(slow).plan(sessions, max_gpus=1)
    assert plan.num_gpus == 1 and plan.unassigned
    pool = PoolLedger(discover("1x16GiB", "simulated"))
    with LocalServingRuntime(models, slow, pool, allocation_timeout=2.0) as rt:
        rt.apply(plan)  # one lease; the unassigned load is routed onto it, not dropped at the frontend
        assert len(pool.leases()) == 1 and {p.session_id for n in rt.plan.nodes for p in n.placements} == {"a", "b"}
        load = LoadGenerator(rt.frontend.submit, RateTrace.constant({"a": 150.0, "b": 60.0}, 1.0), data.x_test,
                             data.y_test).run()
    assert pool.leases() == []
    w = rt.recorder.window(labels=load.labels)
    assert w.offered == load.sent and w.throughput_rps > 0.9 * w.offered_rps  # the real MLP keeps up at this rate


def test_a_query_is_served_as_a_dag_children_issued_by_finished_parents_with_their_slack(served):
    from tasks.serving.chaining import query_bad_rate

    data, models, profiles = served
    sessions = [Session("q/a", "digits_mlp", 100.0, 100.0), Session("q/b", "digits_mlp", 60.0, 200.0)]
    pool = ledger()
    with LocalServingRuntime(models, profiles, pool, chains={"q/b": ("q/a", 2.0)}, seed=3) as rt:
        rt.apply(SquishyPacker(profiles).plan(sessions))
        load = LoadGenerator(rt.frontend.submit, RateTrace.constant({"q/a": 100.0}, 1.5), data.x_test,
                             data.y_test).run()  # load on the root stage only
    assert pool.leases() == []
    by = {}
    for o in rt.recorder.outcomes:
        by.setdefault(o.session_id, {})[o.request_id] = o
    roots, kids = by["q/a"], by["q/b"]
    assert len(roots) == load.sent and 1.5 * len(roots) < len(kids) < 2.5 * len(roots)  # Poisson(2) per parent
    for o in kids.values():
        parent = roots[rt.chainer.root(o.request_id)]
        assert o.arrival_ms == pytest.approx(parent.finish_ms, abs=1e-6)  # issued when the parent's batch finished
        assert o.deadline_ms == pytest.approx(parent.deadline_ms + 60.0, abs=1e-6)  # its slack carried over
    n, bad = query_bad_rate(rt.recorder.outcomes, "q/a", ["q/b"], rt.chainer.root)
    assert n == len(roots) and bad <= 0.05
    assert rt.overhead()["requests"] == len(roots) + len(kids)


def test_a_three_stage_query_resolves_every_request_to_its_root_and_sums_the_stage_budgets(served):
    data, models, profiles = served
    sessions = [Session("q/a", "digits_mlp", 100.0, 80.0), Session("q/b", "digits_cnn_small", 40.0, 80.0),
                Session("q/c", "digits_mlp", 30.0, 80.0)]
    with LocalServingRuntime(models, profiles, ledger(), chains={"q/b": ("q/a", 1.0), "q/c": ("q/b", 1.0)}) as rt:
        rt.apply(SquishyPacker(profiles).plan(sessions))
        LoadGenerator(rt.frontend.submit, RateTrace.constant({"q/a": 80.0}, 1.0), data.x_test, data.y_test).run()
    by = {}
    for o in rt.recorder.outcomes:
        by.setdefault(o.session_id, {})[o.request_id] = o
    assert len(by["q/c"]) > 20  # grandchildren, issued by children that were issued by roots
    for o in by["q/c"].values():
        root = by["q/a"][rt.chainer.root(o.request_id)]
        assert o.deadline_ms == pytest.approx(root.deadline_ms + 40.0 + 30.0, abs=1e-6)


def test_a_worker_that_cannot_start_gives_its_gpu_slice_back(served):
    _, models, profiles = served
    plan = SquishyPacker(profiles).plan([Session("a", "digits_mlp", 100.0, 100.0)])
    pool = ledger()
    with LocalServingRuntime({}, profiles, pool) as rt:  # no models: the worker cannot load digits_mlp
        with pytest.raises(ConfigError, match="model='digits_mlp'"):
            rt.apply(plan)
        assert pool.leases() == []  # released at once, not held by the heartbeat until the process exits
    with pytest.raises(ConfigError, match="preset='bogus'"):
        LocalServingRuntime(models, profiles, pool, preset="bogus")


def test_a_request_of_the_wrong_width_is_refused_and_the_session_keeps_serving(served):
    data, models, profiles = served
    plan = SquishyPacker(profiles).plan([Session("a", "digits_mlp", 100.0, 100.0)])
    with LocalServingRuntime(models, profiles, ledger()) as rt:
        rt.apply(plan)
        row = data.x_test[:1].numpy()
        # the session's first request: refused at the ring, never reaching (and stopping) the worker's model
        with pytest.raises(ConfigError, match=r"inputs='1 rows of 3 values': this session's requests have 64"):
            rt.frontend.submit("a", np.zeros(3, np.float32))
        first = rt.frontend.submit("a", row)
        with pytest.raises(ConfigError, match=r"inputs='2 rows of 65 values'"):
            rt.frontend.submit_many("a", np.zeros((2, 65), np.float32))
        last = rt.frontend.submit("a", row)
    served_ids = {o.request_id for o in rt.recorder.outcomes if o.finish_ms == o.finish_ms}
    assert {first, last} <= served_ids
