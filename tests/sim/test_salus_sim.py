"""``gpuflows simulate salus``: Fig. 2.9's fair shares, Table 2.1's orderings, the CLI, bad scenarios."""

import json
from pathlib import Path

import pytest
import yaml

from gpu.errors import ConfigError, NeverFitsError
from gpu.schedulers.salus.controller import SalusController, SalusJob
from gpu.sim.salus.run import parse_jobs, run
from gpu.sim.salus.engine import simulate
from gpu.sim.salus.workloads import TraceJob, all_workloads, tiresias_like_trace, workload
from gpuflows.cli import main

ROOT = Path(__file__).resolve().parents[2]
FAIR3 = ROOT / "scenarios/salus/fair_three_jobs.yaml"
TABLE = ROOT / "scenarios/salus/table_2_1.yaml"


def _fair3():
    return parse_jobs(yaml.safe_load(FAIR3.read_text()), 0)


def test_fair_shares_go_1_then_half_then_a_third_with_constant_aggregate():
    """Fig. 2.9: three inception3_50 jobs at 0/15/30 s in one lane under FAIR."""
    result = simulate(_fair3(), SalusController(16_000, "fair"))
    windows = {"alone": (5, 15), "two": (20, 30), "three": (35, 100)}
    shares = {w: [result.throughput(j, *span) for j in ("job0", "job1", "job2")] for w, span in windows.items()}
    assert shares["alone"] == pytest.approx([1, 0, 0], abs=0.04)
    assert shares["two"] == pytest.approx([0.5, 0.5, 0], abs=0.04)
    assert shares["three"] == pytest.approx([1 / 3] * 3, abs=0.02)
    assert all(sum(s) == pytest.approx(1.0, abs=1e-6) for s in shares.values())  # one lane: aggregate unchanged
    finish = {j.job_id: j.finish_s for j in result.jobs}
    assert finish["job2"] < finish["job1"] < finish["job0"]  # reverse order, shares climb back


def test_fifo_serves_the_same_three_jobs_one_after_another():
    result = simulate(_fair3(), SalusController(16_000, "fifo"))
    assert result.throughput("job1", 20, 30) == 0.0 and result.throughput("job0", 20, 30) == pytest.approx(1.0)


def _small_trace_scenario(tmp_path, **extra):
    data = {"name": "small", "device_mb": 16000, "seed": 3, "quantum_s": 2.0,
            "trace": {"jobs": 25, "mean_gap_s": 15, "median_s": 60, "sigma": 1.0}, **extra}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_writes_table_2_1_metrics_and_their_orderings(tmp_path):
    """SRTF cuts average JCT, FIFO/SRTF/FAIR share a makespan (one lane, no overhead), PACK's is lower."""
    out = tmp_path / "out.json"
    assert main(["simulate", "salus", str(_small_trace_scenario(tmp_path)), "--json", str(out)]) == 0
    s = json.loads(out.read_text())["summary"]
    assert s["srtf_avg_jct_s"] < s["fair_avg_jct_s"] < s["fifo_avg_jct_s"]
    assert s["srtf_makespan_s"] == pytest.approx(s["fifo_makespan_s"]) == pytest.approx(s["fair_makespan_s"])
    assert s["pack_makespan_s"] < s["fifo_makespan_s"] and s["pack_peak_lanes"] > 1
    assert s["fifo_peak_lanes"] == 1 and s["srtf_jct_speedup_vs_fifo"] > 1
    assert all(s[f"{p}_peak_memory_fraction"] <= 1 for p in ("fifo", "srtf", "pack", "fair"))


def test_one_policy_can_be_chosen_on_the_command_line(tmp_path):
    report = run(str(_small_trace_scenario(tmp_path)), ["pack"])
    assert [r["policy"] for r in report.table] == ["pack"]


def test_trace_is_seeded_and_uses_table_a1_workloads():
    a, b = tiresias_like_trace(30, 5, 15, 60, 1.0), tiresias_like_trace(30, 5, 15, 60, 1.0)
    assert a == b and a != tiresias_like_trace(30, 6, 15, 60, 1.0)
    assert len(all_workloads()) == 45
    assert workload("resnet152_75").persistent_mb + workload("resnet152_75").ephemeral_mb == pytest.approx(13800)


@pytest.mark.parametrize("change, field", [
    ({"policies": ["lottery"]}, "policy"),
    ({"device_mb": -5}, "device_mb"),
    ({"margins": {"totl": 1.1}}, "margins.totl"),
    ({"trace": {"jobs": 0}}, "trace.jobs"),
    ({"jobs": [{"id": "a", "workload": "resnet50_50", "iterations": 3}]}, "jobs"),  # both jobs and trace
    ({"admission": "all"}, "admission"),
])
def test_bad_scenarios_name_the_field(tmp_path, change, field):
    with pytest.raises(ConfigError) as err:
        run(str(_small_trace_scenario(tmp_path, **change)))
    assert err.value.field.startswith(field)


def test_a_job_that_can_never_fit_fails_before_any_simulation(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({"jobs": [
        {"id": "ok", "workload": "vae_64", "iterations": 2},
        {"id": "huge", "persistent_mb": 9000, "ephemeral_mb": 9000, "iter_s": 1, "iterations": 2}]}))
    with pytest.raises(NeverFitsError, match="huge"):
        run(str(path))


def test_srtf_without_an_expected_time_is_refused():
    job = TraceJob(SalusJob("a", 100, 100), 0.0, 1.0, 3, 1.0)
    with pytest.raises(ConfigError, match="expected_s"):
        simulate([job], SalusController(16_000, "srtf"))
