"""Cilantro's round controller (thesis ch. 3 Fig. 3.3): feedback folds into learners, decisions follow the
learned curves, and a saved round continues exactly as an uninterrupted one."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest

from gpu.contract import contract_violations, is_frozen_decision
from gpu.errors import ConfigError
from gpu.schedulers.cilantro.policies import POLICIES, make_policy
from gpu.schedulers.cilantro.forecasters import ArimaForecaster
from gpu.schedulers.cilantro.learners import IntervalBinaryTree
from gpu.schedulers.cilantro.controller import CilantroRound, JobReport, LoadForecasts, RoundJob, policy_names
from gpu.schedulers.cilantro.types import JobSpec


def service(name: str) -> RoundJob:
    """A latency service: attainment in [0, 1] over x = a/ℓ up to 0.02 GPU per req/s."""
    return RoundJob(JobSpec(name, 0.9), 0.02, (0.0, 1.0), partial(IntervalBinaryTree, 0.02, 100.0, bounds=(0.0, 1.0)))


def controller(policy: str = "cilantro-ew", warmup: int = 0, jobs=("a", "b")) -> CilantroRound:
    loads = LoadForecasts({j: ArimaForecaster() for j in jobs}, {j: 50.0 for j in jobs}, horizon=4)
    return CilantroRound(tuple(service(j) for j in jobs), make_policy(policy), capacity=1.0, unit=0.05,
                         max_change=0.2, loads=loads, seed=3, warmup_reports=warmup)


def report(alloc: float, perf: float, load: float = 50.0) -> JobReport:
    return JobReport(alloc, (load,) * 4, (perf,) * 4, (0.05,) * 4)


def test_the_round_follows_the_controller_contract_and_returns_frozen_decisions():
    ctl = controller()
    assert contract_violations(ctl) == [] and (ctl.system, ctl.policy) == ("cilantro", "cilantro-ew")
    d = ctl.on_round(0.0, {})
    assert is_frozen_decision(d) and d.round_index == 0 and d.allocation == {"a": 0.5, "b": 0.5}
    assert d.load_ucb == {"a": 50.0, "b": 50.0}  # no report yet: the nominal loads
    assert policy_names() == list(POLICIES)


def test_reports_fold_into_the_learner_after_the_warmup_and_a_failed_job_keeps_its_learner():
    ctl = controller(warmup=2)
    ctl.on_round(0.0, {})
    ctl.on_round(60.0, {"a": report(0.5, 1.0), "b": None})
    assert ctl.seen == {"a": 4, "b": 0}
    assert ctl.learners["a"].num_points == 2 and ctl.learners["b"].num_points == 0
    assert ctl.feedback["a"].perf == 1.0 and ctl.feedback["b"] is None


def test_the_egalitarian_round_gives_more_to_the_job_whose_measured_performance_is_lower():
    """Same specs, same loads, same allocations; only what the jobs measured differs."""
    ctl = controller()
    d = ctl.on_round(0.0, {})
    for r in range(1, 8):
        d = ctl.on_round(60.0 * r, {"a": report(d.allocation["a"], 1.0), "b": report(d.allocation["b"], 0.3)})
    assert d.allocation["b"] > d.allocation["a"]
    assert d.perf_ucb["a"] == pytest.approx(1.0) and sum(d.allocation.values()) <= 1.0 + 1e-9


def test_a_saved_round_continues_exactly_like_an_uninterrupted_one():
    def drive(ctl, start, stop, d):
        out = []
        for r in range(start, stop):
            perf = {"a": min(1.0, d.allocation["a"] * 2), "b": min(1.0, d.allocation["b"] * 1.2)}
            d = ctl.on_round(60.0 * (r + 1), {j: report(d.allocation[j], perf[j], 40.0 + 5 * r) for j in perf})
            out.append(d)
        return out, d

    one = controller("cilantro-njc")
    whole, _ = drive(one, 0, 8, one.on_round(0.0, {}))
    first = controller("cilantro-njc")
    head, d = drive(first, 0, 4, first.on_round(0.0, {}))
    resumed = controller("cilantro-njc")
    resumed.restore(json.loads(json.dumps(first.save())))
    assert resumed.planned == d
    tail, _ = drive(resumed, 4, 8, resumed.planned)
    assert head + tail == whole


def test_a_state_saved_before_decisions_were_kept_resumes_with_a_fresh_decision():
    ctl = controller()
    ctl.on_round(0.0, {})
    ctl.on_round(60.0, {"a": report(0.5, 1.0), "b": report(0.5, 0.4)})
    old = ctl.save()
    old.pop("planned")  # the state format of earlier versions
    resumed = controller()
    resumed.restore(old)
    d = resumed.on_round(120.0, {})
    assert d.round_index == 1 and resumed.learners["a"].num_points == 4


def test_an_oracle_needs_true_curves_and_the_error_names_the_policy():
    with pytest.raises(ConfigError, match="policy='oracle-ew': an oracle needs each job's true curve"):
        controller("oracle-ew")


def test_feedback_with_mismatched_report_lengths_or_an_unknown_job_is_refused():
    with pytest.raises(ConfigError, match="feedback="):
        JobReport(0.5, (50.0, 50.0), (1.0,), (0.1,))
    ctl = controller()
    ctl.on_round(0.0, {})
    with pytest.raises(ConfigError, match=r"feedback=\['c'\]: not jobs of this round"):
        ctl.on_round(60.0, {"c": report(0.5, 1.0)})


def test_load_forecasts_bound_the_next_round_from_the_reports():
    loads = LoadForecasts({"a": ArimaForecaster()}, {"a": 50.0, "t": 1.0}, horizon=4)
    assert loads.ucb("a", 0) == 50.0 and loads.ucb("t", 0) == 1.0
    loads.observe("a", tuple(np.linspace(40, 80, 12)))
    assert loads.ucb("a", 1) > 80.0  # a rising load: the bound covers the whole next round
