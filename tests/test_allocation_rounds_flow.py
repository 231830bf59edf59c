"""The Cilantro allocation-rounds flow: rounds of real jobs on resized slices, MLflow round runs,
resuming from the saved state after a crash, and bad input."""

from __future__ import annotations

import json

import pytest

import flows.allocation_rounds as ar
import tasks.cilantro.rounds as cr
from gpu.errors import ConfigError
from resource_blocks import GpuPool, MlflowTarget

pytestmark = pytest.mark.usefixtures("prefect_server")

SMALL = dict(round_s=2.0, report_s=0.5, trace_step=10)


def sim_pool(name: str) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="1x16GiB")


def target(state_dir) -> MlflowTarget:
    return MlflowTarget(tracking_uri=f"sqlite:///{state_dir}/mlflow.db", experiment="cilantro-rounds-test")


def round_runs(tgt: MlflowTarget, parent: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tgt.resolved_uri())
    exp = client.get_experiment_by_name(tgt.experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    return sorted((r for r in runs if "cilantro.round" in r.data.tags), key=lambda r: int(r.data.tags["cilantro.round"]))


def test_two_rounds_log_nested_round_runs_within_capacity(state_dir, table_artifacts):
    tgt = target(state_dir)
    out = ar.allocation_rounds(rounds=2, policy="cilantro-njc", pool=sim_pool("cil-two"), capacity=1.0, unit=0.05,
                               run_name="two", mode="thread", tracking=tgt, **SMALL)
    assert [r["round"] for r in out["rounds"]] == [0, 1] and not out["resumed"]
    for row in out["rounds"]:
        assert not row["failed"]
        assert sum(row["allocation"].values()) <= 1.0 + 1e-9
        assert row["held"] == pytest.approx(row["allocation"])  # each task ran on a slice of its allocation
    runs = round_runs(tgt, out["mlflow_run_id"])
    assert [r.data.tags["cilantro.round"] for r in runs] == ["0", "1"]
    for run, row in zip(runs, out["rounds"]):
        m = run.data.metrics
        assert run.data.tags["cilantro.policy"] == "cilantro-njc"
        for key in ("social_welfare", "egalitarian_welfare", "njc_fairness", "decision_time_s"):
            assert key in m
        allocs = {job: m[f"alloc_{job}"] for job in ("svc-a", "svc-b", "trainer")}
        assert allocs == pytest.approx(row["allocation"]) and sum(allocs.values()) <= 1.0 + 1e-9
        assert 0.0 <= m["egalitarian_welfare"] <= m["social_welfare"] <= 1.0
        assert {f"utility_{j}" for j in allocs} <= set(m)
    ui = table_artifacts("cilantro-rounds-two")[0]  # the rounds as the Prefect UI shows them
    assert [r["round"] for r in ui] == [0, 1]
    for shown, row in zip(ui, out["rounds"]):
        assert shown["allocation.svc-a"] == pytest.approx(row["allocation"]["svc-a"], rel=1e-3)
        assert shown["njc_fairness"] == pytest.approx(row["njc_fairness"], rel=1e-3)


def test_resume_after_crash_continues_at_round_3_with_learned_state(state_dir, monkeypatch):
    kw = dict(policy="cilantro-njc", pool=sim_pool("cil-resume"), run_name="crashy", mode="thread", tracking=False,
              **SMALL)
    real_save, saves = cr.save_state, []

    def crash_on_third(run_name, state):
        saves.append(state["next_round"])
        if len(saves) == 3:
            raise RuntimeError("killed before round 3 was saved")
        return real_save(run_name, state)

    monkeypatch.setattr(cr, "save_state", crash_on_third)
    with pytest.raises(RuntimeError, match="killed"):
        ar.allocation_rounds(rounds=3, **kw)
    monkeypatch.setattr(cr, "save_state", real_save)
    saved = json.loads(cr.state_path("crashy").read_text())
    assert saved["next_round"] == 2 and saved["seen"]["svc-a"] == 8  # 2 rounds x 4 reports
    assert saved["learners"]["svc-a"]["nodes"][0][4] == 8  # root node count = observations

    out = ar.allocation_rounds(rounds=1, **kw)
    assert out["resumed"] and out["start_round"] == 2 and [r["round"] for r in out["rounds"]] == [2]
    after = json.loads(cr.state_path("crashy").read_text())
    assert after["next_round"] == 3 and after["seen"]["svc-a"] == 12
    assert after["learners"]["svc-a"]["nodes"][0][4] == 12  # the earlier 8 observations plus this round's 4
    assert after["checkpoints"]["trainer"].endswith("trainer-round-2.pt")
    assert after["history"][0]["allocation"] == saved["history"][0]["allocation"]


def test_negative_capacity_is_rejected_naming_it(state_dir):
    with pytest.raises(ConfigError, match="capacity=-1"):
        ar.allocation_rounds(rounds=1, capacity=-1.0, pool=sim_pool("cil-bad"), tracking=False, mode="thread")


def test_unknown_policy_is_rejected_naming_it(state_dir):
    with pytest.raises(ConfigError, match="policy='no-such-policy'"):
        ar.allocation_rounds(rounds=1, policy="no-such-policy", pool=sim_pool("cil-bad"), tracking=False, mode="thread")


def test_job_without_slo_is_rejected_when_the_policy_needs_one(state_dir):
    jobs = [{"name": "svc-x", "kind": "service", "slo": None}, {"name": "trainer", "kind": "training", "slo": 20.0}]
    with pytest.raises(ConfigError, match="svc-x.slo=None: policy 'cilantro-ew' needs an SLO"):
        ar.allocation_rounds(rounds=1, policy="cilantro-ew", jobs=jobs, pool=sim_pool("cil-bad"), tracking=False,
                             mode="thread")
    fair = ar.settings_from(rounds=1, round_s=20.0, policy="resource-fair", capacity=1.0, unit=0.05, resume=True,
                            run_name="fair", jobs=jobs, report_s=5.0, max_change=None, trace_step=1,
                            warmup_reports=0, seed=0, pool_gpus=1)
    assert [j.slo for j in fair.jobs] == [None, 20.0]  # an equal split needs no SLO


def test_capacity_beyond_the_pool_and_fractional_multi_gpu_units_are_rejected():
    base = dict(rounds=1, round_s=20.0, policy="cilantro-njc", resume=True, run_name="x", jobs=None, report_s=5.0,
                max_change=0.2, trace_step=1, warmup_reports=0, seed=0)
    with pytest.raises(ConfigError, match="capacity=3.0: the pool has only 2"):
        ar.settings_from(capacity=3.0, unit=1.0, pool_gpus=2, **base)
    with pytest.raises(ConfigError, match="unit=0.5"):
        ar.settings_from(capacity=2.0, unit=0.5, pool_gpus=2, **base)


def test_cli_help_lists_the_flow_options(capsys):
    with pytest.raises(SystemExit) as exc:
        ar.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for opt in ("--rounds", "--policy", "--capacity", "--unit", "--run-name", "--no-resume"):
        assert opt in text


def test_a_second_flow_run_of_the_same_run_name_is_refused_while_one_runs(state_dir):
    with ar.run_lock("busy"):
        with pytest.raises(ConfigError, match="run_name='busy': another flow run"):
            ar.allocation_rounds(rounds=1, run_name="busy", pool=sim_pool("cil-busy"), tracking=False, mode="thread",
                                 **SMALL)
    assert not cr.state_path("busy").exists()
