"""flows.colocation in a real Prefect flow: real torch jobs admitted into Salus lanes, per-job rows, MLflow
metrics and the table artifact read back."""

from __future__ import annotations

import pytest

from flows.colocation import colocation, main, switch_gaps, trace
from resource_blocks import GpuPool, MlflowTarget


def test_trace_alternates_long_and_short_jobs():
    assert trace(6, 40) == [40, 10, 20, 40, 10, 20]


def test_switch_gaps_are_measured_between_different_jobs_of_a_lane():
    rows = [{"job": 0, "lane": 0, "spans": [[0.0, 1.0], [1.1, 2.0], [3.5, 4.0]]},
            {"job": 1, "lane": 0, "spans": [[2.25, 3.0]]},
            {"job": 2, "lane": 1, "spans": [[0.5, 9.0]]}]
    assert switch_gaps(rows) == pytest.approx([0.25, 0.5])


def test_bad_arguments_fail_before_a_flow_run(capsys):
    assert main(["--policy", "lottery"]) == 2
    assert "policy" in capsys.readouterr().err
    assert main(["--jobs", "0"]) == 2


@pytest.mark.usefixtures("prefect_server")
def test_srtf_runs_every_job_in_one_lane_and_records_the_run(state_dir, tmp_path, table_artifacts):
    from mlflow import MlflowClient

    target = MlflowTarget(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="salus-test")
    out = colocation(jobs=3, iterations=8, gap_s=0.0, policy="srtf", mode="thread",
                     pool=GpuPool(name="salus-flow", device_backend="simulated", simulated="1x16GiB"),
                     tracking=target)
    rows = out["jobs"]
    assert [r["iterations"] for r in rows] == [8, 2, 4]
    assert {r["lane"] for r in rows} == {0} and all(r["accuracy"] > 0.2 for r in rows)
    assert out["summary"]["avg_jct_s"] <= out["summary"]["makespan_s"] + 1e-6
    table = table_artifacts("salus-jobs-srtf")[0]
    assert sorted(r["job"] for r in table) == [0, 1, 2]
    client = MlflowClient(target.resolved_uri())
    runs = client.search_runs([client.get_experiment_by_name("salus-test").experiment_id])
    flow_run = [r for r in runs if "avg_jct_s" in r.data.metrics]
    assert flow_run and flow_run[0].data.metrics["lanes"] == 1.0
    assert flow_run[0].data.metrics["switches"] >= 2  # SRTF: the short jobs pre-empt the long one at boundaries
    assert GpuPool(name="salus-flow", device_backend="simulated").open_ledger().leases() == []
