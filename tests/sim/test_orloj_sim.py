"""ORLOJ simulator and baselines (thesis §4.5): the worker, the Clockwork/Clipper/Nexus-like behaviours, the CLI."""

import json
from dataclasses import replace

import pytest

from gpu.batching import BatchContext, BatchDecision, InferenceRequest
from gpu.errors import ConfigError
from gpu.schedulers.nexus.planned import NexusPlanned
from gpu.schedulers.orloj.baselines import ClipperLike, ClockworkLike
from gpu.sim.orloj.run import Setup, build_policy, nexus_plan, serve, sweep
from gpu.sim.orloj.workload import AppDistribution, Case, lognormal_sigma, parse
from gpuflows.cli import main

BIMODAL = {"name": "std-1", "apps": [{"id": "short", "normal": {"mean_ms": 50, "std_ms": 10}},
                                     {"id": "long", "normal": {"mean_ms": 100, "std_ms": 10}}]}


def scenario(**over):
    raw = {"cases": [BIMODAL], "requests": 300, "seeds": 1, "slo_multipliers": [3]}
    raw.update(over)
    return parse(raw)


def test_every_offered_request_is_finished_late_or_dropped():
    sc = scenario()
    setup = Setup.build(sc.cases[0], sc)
    for name in sc.policies:
        out = serve(setup, build_policy(name, setup, sc, 3 * setup.p99_ms), 3 * setup.p99_ms, 0, setup.duration_s(sc))
        assert out.offered > 200 and out.good + out.late + out.dropped == out.offered


def test_orloj_finishes_more_requests_than_every_baseline_on_a_bimodal_mix():
    """Table C.1 std-1 at 3× P99: ORLOJ ahead of Clockwork-, Nexus- and Clipper-like."""
    rows = sweep(scenario(requests=600, seeds=2), ["orloj", "clockwork", "nexus", "clipper"])
    rate = {r["policy"]: r["finish_rate"] for r in rows}
    assert rate["orloj"] >= 0.85
    assert all(rate["orloj"] > rate[p] for p in ("clockwork", "nexus", "clipper"))
    assert 0.2 <= rate["clockwork"] <= 0.6  # fails about every other batch (§4.5.3): half its throughput lost


def test_the_point_estimate_ignores_the_straggler_and_orloj_does_not():
    sc = scenario()
    setup = Setup.build(sc.cases[0], sc)
    orloj = build_policy("orloj", setup, sc, 3 * setup.p99_ms)
    assert orloj.table.means[None, 4] > setup.point_latency(4) * 1.2  # E[max] of a bimodal batch vs the mean


def ctx(now):
    return BatchContext(now, lambda b: 10.0 * b, 1, 16)


def test_clockwork_like_fails_the_batch_planned_after_an_overrun():
    policy = ClockworkLike(batch_sizes=(1, 2, 4))
    queue = [InferenceRequest(i, "a", 0.0, 100.0 + i) for i in range(6)]
    first = policy.decide(queue, ctx(0.0))
    assert first.run == (0, 1, 2, 3)  # largest batch predicted (40 ms) to meet the earliest deadline
    policy.observe([queue[i] for i in first.run], 0.0, 55.0)  # ran 15 ms past its prediction
    second = policy.decide(queue[4:], ctx(55.0))
    assert second.run == () and sorted(second.drop) == [0, 1]
    third = policy.decide([InferenceRequest(9, "a", 55.0, 200.0)], ctx(55.0))
    assert third.run == (0,)


def test_clipper_like_adds_one_while_within_the_slo_and_backs_off_ten_percent():
    policy = ClipperLike()
    batch = [InferenceRequest(0, "a", 0.0, 50.0)]
    for _ in range(11):
        policy.observe(batch, 0.0, 40.0)
    assert policy.size == 12
    policy.observe(batch, 0.0, 60.0)
    assert policy.size == 10  # floor(12 · 0.9)
    assert policy.decide([InferenceRequest(i, "a", 0, 1) for i in range(30)], ctx(0.0)).run == tuple(range(10))


def test_nexus_runs_one_batch_of_its_plan_per_duty_cycle():
    policy = NexusPlanned(duty_ms=100.0)
    queue = [InferenceRequest(i, "a", 0.0, 500.0 + i) for i in range(6)]
    plan = BatchContext(0.0, lambda b: 10.0 * b, 4, 16)
    assert policy.decide(queue, plan).run == (0, 1, 2, 3)  # the plan's batch, by Nexus's early drop
    assert policy.decide(queue[4:], replace(plan, now_ms=40.0)) == BatchDecision(wake_at_ms=100.0)
    assert policy.decide(queue[4:], replace(plan, now_ms=100.0)).run == (0, 1)
    with pytest.raises(ConfigError) as err:
        NexusPlanned(duty_ms=0.0)
    assert err.value.field == "duty_ms"


def test_nexus_plans_from_the_mean_latency_and_the_offered_rate():
    """Squishy bin packing on the point estimate (§6.1): the GPU is not saturated on paper (the mean request
    underestimates a padded batch), so the session is a residual one: the largest batch whose gathering and
    run fit the SLO (b/r + ℓ(b) ≤ SLO), once per b/r. A relaxed SLO gets the largest batch; a tight one a small
    batch whose promised worst case, a duty cycle and a run, fits it."""
    sc = scenario()
    setup = Setup.build(sc.cases[0], sc)
    assert setup.rate_per_s < 1000.0 * 16 / setup.point_latency(16)
    batch, duty = nexus_plan(setup, 5 * setup.p99_ms)
    assert batch == 16 and duty == pytest.approx(1000.0 * 16 / setup.rate_per_s)
    batch, duty = nexus_plan(setup, 1.5 * setup.p99_ms)
    assert batch < 16 and duty + setup.point_latency(batch) <= 1.5 * setup.p99_ms


def test_lognormal_proxy_has_the_tables_mean_and_p99():
    import numpy as np

    app = AppDistribution("chat", "lognormal", 79.47, 143.40)
    x = app.sample(np.random.default_rng(0), 400_000)
    assert x.mean() == pytest.approx(79.47, rel=0.01) and np.percentile(x, 99) == pytest.approx(143.40, rel=0.02)
    assert lognormal_sigma(100.0, 100.5) > 0


@pytest.mark.parametrize("over, field", [
    ({"policies": ["orloj", "fifo"]}, "policies"),
    ({"cases": []}, "cases"),
    ({"cases": [{"name": "x", "apps": [{"id": "a", "lognormal": {"mean_ms": 80, "p99_ms": 60}}]}]},
     "lognormal.p99_ms"),
    ({"cases": [{"name": "x", "apps": [{"id": "a"}]}]}, "cases[0].apps[0]"),
    ({"load": -1}, "load"),
    ({"cost": {"model": "eq43", "c0_fraction": 2}}, "cost.c0_fraction"),
    ({"cost": {"overhead_ms": 100}}, "cost.overhead_ms"),
    ({"cost": {"model": "eq43", "profile": "cpu.json"}}, "cost.profile"),
    ({"cost": {"profile": "no-such-table.json"}}, "cost.profile"),
    ({"cost": {"network": "resnet"}}, "cost.network"),
    ({"cost": {"model": "guess"}}, "cost.model"),
    ({"orloj": {"b": 0}}, "orloj.b"),
    ({"slo": 3}, "scenario.slo"),
])
def test_bad_scenarios_name_the_field(over, field):
    with pytest.raises(ConfigError) as err:
        parse({"cases": [BIMODAL], **over})
    assert err.value.field == field


def test_cli_simulates_orloj_and_writes_the_headline_figures(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"cases": [BIMODAL], "requests": 200, "seeds": 1, "slo_multipliers": [2]}))
    out = tmp_path / "out.json"
    assert main(["simulate", "orloj", str(path), "--policy", "orloj", "--policy", "clockwork", "--json",
                 str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {"finish_rate_orloj", "finish_rate_clockwork", "orloj_over_best_baseline_2x"}
    assert main(["simulate", "orloj", str(path), "--policy", "edf"]) == 2
    assert "policy='edf'" in capsys.readouterr().err


def test_a_static_model_needs_no_distribution_awareness():
    """Table C.3: with constant times ORLOJ's estimate is the point estimate."""
    sc = replace(scenario(), cases=(Case("resnet", (AppDistribution("img", "constant", 20.0),)),))
    setup = Setup.build(sc.cases[0], sc)
    orloj = build_policy("orloj", setup, sc, 3 * setup.p99_ms)
    for bs in (1, 4, 16):
        assert orloj.table.means[None, bs] == pytest.approx(setup.point_latency(bs), rel=0.01)


def test_orloj_runs_per_gpu_on_a_multi_gpu_nexus_plan_with_a_dynamic_model():
    """simulate_plan with alone times: batches cost their slowest request, each GPU owns its policy."""
    import numpy as np

    from gpu.systems import make_batch_policy as make_policy
    from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session
    from gpu.schedulers.nexus.profiles import linear_profile
    from gpu.sim.nexus.engine import AloneTimes, simulate_plan

    sc = scenario()
    setup = Setup.build(sc.cases[0], sc)
    mean = float(np.mean([a.mean_ms for a in setup.case.apps]))
    profile = linear_profile("m", mean - setup.model.c0, setup.model.c0, 16)  # what a data-independent profile sees
    slo = 3 * setup.p99_ms
    plan = Plan("fixed", "paper", tuple(GpuNode(i, slo / 2, (SessionPlacement("s", "m", slo, 4, 6.0, 0.0, 0.0),))
                                        for i in range(2)), (Session("s", "m", slo, 12.0),))
    made = []

    def orloj():
        made.append(make_policy("orloj", histograms=setup.histograms, model=setup.model))
        return made[-1]

    costs = {"m": AloneTimes(setup.model, lambda rng, n: setup.case.sample(rng, n)[1])}
    res = simulate_plan(plan, {"m": profile}, None, policy_factory=orloj, alone_times=costs, duration_s=30,
                        log_batches=True)
    stats = res.sessions["s"]
    assert len(made) == 2 and made[0] is not made[1]
    assert stats.offered > 300 and stats.good + stats.late + stats.dropped == stats.offered
    assert stats.good / stats.offered > 0.8
    ones = {round(b.finish_ms - b.start_ms, 6) for b in res.batch_log if b.size == 1}
    assert len(ones) > 10  # a batch of one lasts its request's own alone time, not ℓ(1)
    with pytest.raises(ConfigError):
        simulate_plan(plan, {"m": profile}, None)


def test_an_slo_below_every_alone_time_is_refused_before_simulating():
    sc = scenario(slo_multipliers=[0.05])
    with pytest.raises(ConfigError) as err:
        sweep(sc, ["orloj"])
    assert err.value.field == "slo_multipliers"


def test_the_rollouts_epoch_feedback_replaying_the_simulators_measurements_reprofiles_the_same():
    """One mechanism, two clocks: the simulator calls ``on_epoch`` at its epoch boundaries with the requests it
    timed alone; the serving rollout's ``EpochFeedback``, handed the same measurements at the same epoch ends,
    reaches the same histograms and batch limits, and a worker's copy of the policy ends where the simulator's
    did."""
    import numpy as np

    from gpu.schedulers.orloj.controller import OrlojController
    from gpu.schedulers.orloj.profiler import OnlineProfiler
    from tasks.serving.epochs import EpochFeedback

    sc = scenario(requests=600, cost={"model": "eq43", "overhead_ms": 100}, orloj={"profiler": "online", "epoch_s": 2})
    setup = Setup.build(sc.cases[0], sc)
    slo = 3 * setup.p99_ms
    simulated = build_policy("orloj", setup, sc, slo)
    cold = dict(simulated.histograms)
    out = serve(setup, simulated, slo, 0, setup.duration_s(sc), profiler=OnlineProfiler(seed=0), epoch_s=2)
    assert len(out.epochs) >= 3 and all(e.t_ms == 2000.0 * (i + 1) for i, e in enumerate(out.epochs))
    assert sum(bool(e.decision.histograms) for e in out.epochs) >= 2
    assert simulated.histograms["long"].mean != cold["long"].mean  # it learned from what it timed

    replay = OrlojController(build_policy("orloj", setup, sc, slo), profiler=OnlineProfiler(seed=0),
                             slo_ms={a.app_id: slo for a in setup.case.apps})
    worker = build_policy("orloj", setup, sc, slo)
    measured = iter(out.epochs)
    feedback = EpochFeedback(2.0, lambda: next(measured).batches, lambda adopt: adopt(worker), orloj=replay)
    for e in out.epochs:
        feedback.on_beacon(e.t_ms / 1000.0, {})
    assert len(feedback.orloj_epochs) == len(out.epochs)
    for sim, row in zip(out.epochs, feedback.orloj_epochs):
        hists = dict(sim.decision.histograms)
        for app, limit in sim.decision.batch_limits:
            assert row["apps"][app]["batch_limit"] == limit
            assert row["apps"][app]["mean_alone_ms"] == (hists[app].mean if app in hists else None)
    for app, h in simulated.histograms.items():
        assert np.array_equal(worker.histograms[app].edges, h.edges)
        assert np.array_equal(worker.histograms[app].masses, h.masses)
