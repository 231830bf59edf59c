"""The CPU pre-processing model of the Nexus simulator: overlapped (OL, §6.3) or serialised with the GPU."""

from dataclasses import replace

import pytest

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session, SquishyPacker
from gpu.schedulers.nexus.profiles import linear_profile, serial_preprocess
from gpu.schedulers.nexus.synthetic import synthetic_profiles
from gpu.systems import make_batch_policy as make_policy
from gpu.schedulers.nexus.policies import POLICIES as STRATEGIES
from gpu.sim.nexus.run import NexusScenario, evaluate, max_load, run, scaled_sessions
from gpu.sim.nexus.engine import simulate_plan

NEXUS = STRATEGIES["nexus"]
NO_OL = replace(NEXUS, name="nexus_no_overlap", overlap=False)


def one_session(slo_ms: float, rate: float, preprocess_ms: float = 10.0, model: str = "resnet50") -> NexusScenario:
    return NexusScenario("ol", "paper", synthetic_profiles(), (Session("s", model, slo_ms, rate),), (), 1, 2.0,
                         "uniform", 3, preprocess_ms={model: preprocess_ms})


def test_without_overlap_every_batch_takes_b_times_preprocessing_plus_its_forward():
    sc = one_session(200.0, 60.0, model="m")
    prof = linear_profile("m", 1.0, 5.0, 16)
    sc = replace(sc, profiles={**sc.profiles, "m": prof}, arrivals="poisson")
    _, res = evaluate(sc, NO_OL, gpus=1, log_batches=True)
    sizes = {r.size for r in res.batch_log}
    assert max(sizes) > 1  # batching happened, so b·p is not just p
    for r in res.batch_log:
        assert r.finish_ms - r.start_ms == pytest.approx(r.size * 10.0 + prof.latency(r.size))


def test_serial_preprocess_pads_the_forward_but_charges_only_the_real_inputs():
    table = serial_preprocess(replace(linear_profile("t", 1.0, 5.0, 8), batches=(1, 4, 8),
                                      latency_ms=(6.0, 9.0, 13.0)), 2.0)
    assert table.batches == tuple(range(1, 9))
    assert [table.latency(b) for b in (1, 2, 4, 5)] == [8.0, 13.0, 17.0, 23.0]  # ℓ(padded size) + b·p


def test_an_overlapped_request_joins_a_batch_only_after_its_preprocessing():
    # GPU budget SLO − p = 10 ms of a 50 ms SLO, ℓ(1) = 6 ms: ready at t + p, done at t + p + 6 ≤ t + 50
    p, slo = 40.0, 10.0
    plan = Plan("fixed", "paper", (GpuNode(0, slo, (SessionPlacement("s", "m", slo, 1, 10.0, 6.0, slo),)),),
                (Session("s", "m", slo, 10.0),))
    runs = [simulate_plan(plan, {"m": linear_profile("m", 0.0, 6.0, 1)}, make_policy("early_drop"), duration_s=2.0,
                          arrivals="uniform", ready_ms=ready, log_batches=True) for ready in (None, {"s": p})]
    at_arrival, after_p = ([b.start_ms for b in r.batch_log] for r in runs)
    assert len(at_arrival) == len(after_p) == 20  # the same 20 requests, each a batch of one
    assert [b - a for a, b in zip(at_arrival, after_p)] == pytest.approx([p] * 20)  # each waits exactly p
    assert runs[1].total("good") == 20  # and still finishes within the full 50 ms


def test_at_low_load_overlapped_requests_start_after_preprocessing_and_meet_their_slo():
    _, res = evaluate(one_session(50.0, 20.0), NEXUS, gpus=1, log_batches=True)
    assert res.bad_rate == 0.0 and res.batch_log
    assert min(r.start_ms for r in res.batch_log) >= 10.0  # nothing is ready before the first pre-processing


def test_overlap_is_worth_most_at_a_tight_slo():
    """§7.3.1: OL "critical in the tight-SLO/small model regime", less so with relaxed SLOs (§7.3.2)."""
    def planned_gain(slo_ms: float) -> float:
        out = []
        for st in (NEXUS, NO_OL):
            sessions, profiles = scaled_sessions(one_session(slo_ms, 100.0), st)
            out.append(SquishyPacker(profiles).max_throughput(sessions[0])[1])
        return out[0] / out[1]

    assert planned_gain(50.0) > planned_gain(400.0) > 1.0
    tight = one_session(50.0, 100.0)
    assert max_load(tight, NEXUS, 1, iters=4) > 4 * max_load(tight, NO_OL, 1, iters=4)


@pytest.mark.parametrize("baseline", ["batch_oblivious_fixed_batch", "batch_oblivious_lazy_drop"])
def test_the_batch_oblivious_baselines_serialise_preprocessing(baseline):
    """§7.2's TF-like and Clipper-like systems: each batch takes b·p + ℓ(b) (no OL)."""
    sc = replace(one_session(200.0, 60.0), arrivals="poisson")
    _, res = evaluate(sc, STRATEGIES[baseline], gpus=1, log_batches=True)
    prof = sc.profiles["resnet50"]
    assert res.batch_log and max(r.size for r in res.batch_log) > 1
    for r in res.batch_log:
        assert r.finish_ms - r.start_ms == pytest.approx(r.size * 10.0 + prof.latency(r.size))


def test_nexus_and_its_ablations_overlap_preprocessing():
    assert all(STRATEGIES[n].overlap for n in ("nexus", "batch_oblivious", "batch_oblivious_lazy_drop_overlap"))


def test_a_scenario_without_preprocessing_plans_alike_with_and_without_overlap():
    sc = replace(one_session(50.0, 500.0), preprocess_ms={})
    assert scaled_sessions(sc, NEXUS) == scaled_sessions(sc, NO_OL)


def write(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text,field", [
    ("models: [{name: m, alpha_ms: 1, beta_ms: 1, preprocess_ms: -1}]\n"
     "sessions: [{id: s, model: m, slo_ms: 50, rate: 1}]\n", r"models\[0\]\.preprocess_ms=-1"),
    ("prefix_groups: [{name: g, prefix: resnet50, suffix: {beta_ms: 0.05}, models: [v], preprocess_ms: -2}]\n"
     "sessions: [{id: s, model: v, slo_ms: 50, rate: 1}]\n", r"prefix_groups\[0\]\.preprocess_ms=-2"),
])
def test_negative_preprocessing_is_a_config_error_naming_it(tmp_path, text, field):
    with pytest.raises(ConfigError, match=field):
        run(write(tmp_path, text), ["nexus"])


@pytest.mark.parametrize("policy", ["nexus", "batch_oblivious_lazy_drop"])  # OL: SLO ≤ p; no OL: 2·(p + ℓ(1)) > SLO
def test_a_builtin_model_takes_preprocessing_and_an_slo_must_leave_room_for_it(tmp_path, policy):
    text = "models: [{name: resnet50, preprocess_ms: 60}]\nsessions: [{id: s, model: resnet50, slo_ms: 50, rate: 1}]\n"
    with pytest.raises(ConfigError, match=r"s\.slo_ms=50"):
        run(write(tmp_path, text), [policy])
    text = text.replace("preprocess_ms: 60", "preprocess_ms: 10")
    row = run(write(tmp_path, text), [policy]).table[0]
    assert row["overlap"] is (policy == "nexus") and row["bad_rate"] == 0.0


def test_preprocessing_spread_over_k_threads_costs_ceil_b_over_k_times_p():
    prof = linear_profile("m", 1.0, 5.0, 9)
    spread = serial_preprocess(prof, 10.0, threads=4)
    assert [spread.latency(b) - prof.latency(b) for b in (1, 4, 5, 9)] == [10.0, 10.0, 20.0, 30.0]


def test_preprocess_threads_must_be_a_positive_integer(tmp_path):
    text = "preprocess_threads: 0\nsessions: [{id: s, model: resnet50, slo_ms: 50, rate: 1}]\n"
    with pytest.raises(ConfigError, match=r"preprocess_threads=0"):
        run(write(tmp_path, text), ["nexus"])

