"""EkyaController (thesis §2.4): the window loop both worlds drive, on Table 2.1 and the policy names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpu.contract import contract_violations, is_frozen_decision
from gpu.errors import ConfigError
from gpu.schedulers.ekya.thief import EkyaParams, RetrainConfig, StreamState, infer_job, train_job
from gpu.schedulers.ekya.controller import EkyaController
from gpu.schedulers.ekya.policies import make_policy, policy_names
from gpu.sim.ekya.run import simulate_policy
from gpu.sim.ekya.scenario import load

TABLE_2_1 = Path(__file__).resolve().parents[2] / "scenarios" / "ekya" / "table_2_1.yaml"
TOY = EkyaParams(delta=0.1, a_min=0.40)


def _window_1() -> list[StreamState]:
    return [StreamState("A", 0.65, (RetrainConfig("cfg1", 0.75, 85), RetrainConfig("cfg2", 0.70, 65))),
            StreamState("B", 0.50, (RetrainConfig("cfg1", 0.90, 80), RetrainConfig("cfg2", 0.85, 50)))]


def _controller(policy: str) -> EkyaController:
    return EkyaController(make_policy(policy, ["cfg1", "cfg2"], TOY), gpus=3)


def test_controller_follows_the_contract_and_returns_frozen_steps():
    c = _controller("thief")
    assert contract_violations(c) == [] and c.system == "ekya" and c.policy == "thief"
    step = c.on_window_start(0.0, _window_1(), 120.0)
    assert is_frozen_decision(step) and is_frozen_decision(step.decision)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.now = 1.0


def test_table_2_1_thief_retrains_b_first_then_re_invokes_over_the_freed_gpus():
    """Fig. 2.4: B retrains with cfg2 at the window start; when it completes the thief is re-invoked with
    the freed GPUs and B's better model, and A may now retrain."""
    c = _controller("thief")
    first = c.on_window_start(0.0, _window_1(), 120.0)
    assert [(s.stream, s.config) for s in first.starts] == [("B", "cfg2")]
    b = first.starts[0]
    assert b.expected_s == pytest.approx(50 / b.gpus) and b.accuracy == 0.85
    assert sum(first.allocation().values()) <= 3 + 1e-9
    done = c.on_job_done(b.expected_s, "B", 0.85)
    assert done.decision is not None and "B" not in done.running
    # the freed GPUs seed B's inference (clipped at the one-GPU job cap)
    assert done.decision.start[infer_job("B")] == pytest.approx(min(1.0, first.infer["B"] + b.gpus))
    assert train_job("B") not in done.decision.allocation()  # B does not retrain twice in a window
    assert sum(done.allocation().values()) <= 3 + 1e-9


def test_static_baseline_gives_freed_gpus_to_the_streams_own_inference():
    c = _controller("uniform_cfg1_50")
    first = c.on_window_start(0.0, _window_1(), 120.0)
    assert {s.stream for s in first.starts} == {"A", "B"} and first.infer == {"A": 0.75, "B": 0.75}
    done = c.on_job_done(80 / 0.75, "B", 0.90)
    assert done.decision is None and done.starts == ()
    assert done.infer == {"A": 0.75, "B": 1.5} and done.running == {"A": 0.75}


def test_a_job_the_controller_did_not_start_is_refused():
    c = _controller("thief")
    c.on_window_start(0.0, _window_1(), 120.0)
    with pytest.raises(ConfigError, match="stream='A'"):
        c.on_job_done(10.0, "A", 0.7)


def test_simulator_decisions_are_the_controllers():
    """The simulator only applies the controller's steps: replaying its events through a fresh controller
    gives the same decisions."""
    sc = load(TABLE_2_1)
    sim = simulate_policy(sc, "thief").decisions
    c = EkyaController(make_policy("thief", sc), sc.gpus)
    states = [StreamState(s.name, s.windows[0].start_accuracy, s.windows[0].configs, s.inference) for s in sc.streams]
    step = c.on_window_start(0.0, states, sc.window_s)
    assert step.decision == sim[0][2]
    t, _, second = sim[1][1], sim[1][0], sim[1][2]
    finished = next(s for s in step.starts if step.now + s.expected_s == pytest.approx(t))
    assert c.on_job_done(t, finished.stream, finished.accuracy).decision == second


def test_policy_names_list_every_family_and_each_one_builds():
    names = policy_names(load(TABLE_2_1))
    assert names == ("thief", "thief_start_splits", "noretrain", "fixedres", "uniform_cfg1_<pct>", "uniform_cfg2_<pct>",
                     "fixedconfig_cfg1", "fixedconfig_cfg2")
    for name in names:
        policy = make_policy(name.replace("<pct>", "50"), ["cfg1", "cfg2"])
        assert policy.name == name.replace("<pct>", "50")
    assert make_policy("fixedconfig_cfg2", ["cfg2"]).reinvoke and not make_policy("fixedres", ["cfg2"]).reinvoke


@pytest.mark.parametrize("name", ["fifo", "uniform_cfg3_50", "uniform_cfg1_0", "uniform_cfg1_101", "fixedconfig_"])
def test_unknown_policy_is_one_config_error_naming_it(name):
    with pytest.raises(ConfigError) as err:
        make_policy(name, ["cfg1", "cfg2"])
    assert err.value.field == "policy" and str(err.value).startswith(f"policy={name!r}")
