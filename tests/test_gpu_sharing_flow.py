"""flows.gpu_sharing in a real Prefect flow: one trace of real torch jobs under each Salus policy, MLflow and the
Prefect artifacts read back; the trace and the measured metrics on their own."""

from __future__ import annotations

import numpy as np
import pytest

from flows.gpu_sharing import gpu_sharing, main, prepare
from gpu.errors import ConfigError
from resource_blocks import GpuPool, MlflowTarget
from tasks.salus.outcomes import lane_overlaps, peak_lanes, summarise, switch_gaps
from tasks.salus.trace import explicit_trace, sharing_trace

# One long trainer first, then seven short jobs arriving while it runs (Fig. 2.8a's situation); the short ones
# dominate the average, so a loaded machine slowing the long one does not decide the comparison.
LONG_FIRST = [{"workload": "resnet152_75", "iterations": 120, "arrival_s": 0.0},
              *({"workload": "vae_64", "iterations": 3, "arrival_s": 0.05} for _ in range(6)),
              {"kind": "infer", "workload": "alexnet", "iterations": 3, "arrival_s": 0.05}]


def _pool(name: str) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="1x16GiB")


def test_the_seeded_trace_mixes_trainers_and_inference_loops_reproducibly():
    trace = sharing_trace(jobs=40, seed=3, mean_gap_s=0.1, median_iterations=20)
    assert trace == sharing_trace(jobs=40, seed=3, mean_gap_s=0.1, median_iterations=20)
    assert {j.kind for j in trace} == {"train", "infer"}
    assert trace[0].arrival_s == 0 and all(a.arrival_s <= b.arrival_s for a, b in zip(trace, trace[1:]))
    assert all(j.iterations >= 2 and j.steps >= 1 for j in trace)
    big, small = explicit_trace([{"workload": "resnet152_75", "iterations": 2}, {"workload": "vae_64", "iterations": 2}])
    assert big.persistent_mb > small.persistent_mb and big.hidden > small.hidden and big.steps > small.steps


def test_measured_metrics_come_from_the_iteration_spans():
    rows = [{"job": "a", "lane": 0, "arrival_s": 0.0, "admitted_s": 0.0, "end_s": 2.0, "queuing_s": 0.0, "jct_s": 2.0,
             "setup_s": 0.0, "spans": [(0.0, 1.0), (1.1, 2.0)]},
            {"job": "b", "lane": 0, "arrival_s": 0.5, "admitted_s": 0.5, "end_s": 3.0, "queuing_s": 2.25, "jct_s": 2.5,
             "setup_s": 1.75, "spans": [(2.25, 3.0)]},
            {"job": "c", "lane": 1, "arrival_s": 0.5, "admitted_s": 0.6, "end_s": 1.0, "queuing_s": 0.2, "jct_s": 0.5,
             "setup_s": 0.1, "spans": [(0.7, 1.0)]}]
    assert switch_gaps(rows) == pytest.approx([0.25])
    assert lane_overlaps(rows) == [] and peak_lanes(rows) == 2
    rows[1]["spans"] = [(1.5, 3.0)]  # b started inside a's second iteration in the same lane
    assert lane_overlaps(rows) == [("a", "b")]
    summary = summarise(rows)
    assert summary["makespan_s"] == 3.0 and summary["avg_jct_s"] == pytest.approx(5 / 3)


@pytest.mark.parametrize("changes, field", [
    ({"policies": ["fifo", "lottery"]}, "policies"),
    ({"policies": []}, "policies"),
    ({"policies": "fifo"}, "policies"),
    ({"jobs": 0}, "jobs"),
    ({"gap_s": -1.0}, "gap_s"),
    ({"mode": "gpu"}, "mode"),
    ({"memory": "guessed"}, "memory"),
    ({"trace": [{"workload": "resnet50_500", "iterations": 3}]}, "trace[0].workload"),
    ({"trace": [{"workload": "vae_64", "iterations": 3, "kind": "serve"}]}, "trace[0].kind"),
])
def test_bad_input_is_one_config_error_naming_the_field(changes, field):
    args = dict(jobs=4, seed=0, gap_s=0.1, median_iterations=5, trace=None, policies=None, mode="thread",
                memory="declared") | changes
    with pytest.raises(ConfigError) as exc:
        prepare(None, False, **args)
    assert exc.value.field == field


def test_bad_arguments_fail_before_a_flow_run(capsys):
    assert main(["--policies", "fifo", "lottery"]) == 2
    assert "policies='lottery'" in capsys.readouterr().err
    assert main(["--jobs", "0"]) == 2


@pytest.mark.usefixtures("prefect_server")
def test_srtf_beats_fifo_on_a_long_job_first_and_every_policy_is_an_mlflow_run(state_dir, tmp_path, table_artifacts):
    from mlflow import MlflowClient

    target = MlflowTarget(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="salus-sharing-test")
    out = gpu_sharing(trace=LONG_FIRST, policies=["fifo", "srtf", "pack"], mode="thread", pool=_pool("salus-share"),
                      tracking=target)
    fifo, srtf, pack = (out["policies"][p] for p in ("fifo", "srtf", "pack"))
    # SRTF lets the short jobs pre-empt the long one at its iteration boundaries (Fig. 2.8a); FIFO makes them wait
    jct = {p: out["policies"][p]["summary"]["avg_jct_s"] for p in ("fifo", "srtf")}
    short = {p: np.mean([r["jct_s"] for r in out["policies"][p]["jobs"][1:]]) for p in ("fifo", "srtf")}
    assert jct["srtf"] < jct["fifo"] and short["srtf"] < 0.5 * short["fifo"], (jct, short)
    for policy in out["policies"].values():
        assert lane_overlaps(policy["jobs"]) == []  # one iteration at a time per lane, read from the spans
        assert all(r["token_grants"] == r["iterations"] for r in policy["jobs"])  # the executor's token log agrees
        assert [r["iterations"] for r in policy["jobs"]] == [120] + [3] * 7
        # a job arrives before it is admitted: the table shows no negative queuing or JCT (the arrival was stamped
        # after the submit returned, while the first job already ran)
        assert all(r["arrival_s"] <= r["admitted_s"] and r["queuing_s"] >= 0 for r in policy["jobs"]), policy["jobs"]
    assert srtf["summary"]["peak_lanes"] == 1 and srtf["summary"]["switches"] >= 2
    assert pack["summary"]["peak_lanes"] >= 2  # PACK opens a lane per job that fits beside the others
    assert out["note"].startswith("lanes are accounting only")
    assert out["mlflow_errors"] == []
    assert [r["job"] for r in table_artifacts("salus-jobs-srtf")[0]] == [f"job{i}" for i in range(8)]
    assert [r["policy"] for r in table_artifacts("salus-policies")[0]] == ["fifo", "srtf", "pack"]

    client = MlflowClient(target.resolved_uri())
    runs = client.search_runs([client.get_experiment_by_name("salus-sharing-test").experiment_id])
    parent = [r for r in runs if "srtf_avg_jct_s" in r.data.metrics]
    assert len(parent) == 1
    nested = {r.data.tags["policy"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert set(nested) == {"fifo", "srtf", "pack"}
    for policy, run in nested.items():
        assert run.data.metrics["avg_jct_s"] == pytest.approx(out["policies"][policy]["summary"]["avg_jct_s"])
        assert {"makespan_s", "avg_queuing_s", "p95_jct_s", "peak_lanes", "sim_avg_jct_s"} <= set(run.data.metrics)
        assert [a.path for a in client.list_artifacts(run.info.run_id, "charts")] == [f"charts/salus-lanes-{policy}.png"]
    assert "switch_ms_median" in nested["srtf"].data.metrics
    # every job of every policy is a task run of the flow's own run (the run a user clicks), Completed
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run_id = parent[0].data.tags["prefect.flow_run_id"]
    with get_client(sync_client=True) as prefect:
        tasks = prefect.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    assert len(tasks) == 3 * len(LONG_FIRST) and all(t.state.is_completed() for t in tasks)
    assert {t.name.split("-")[0] for t in tasks} == {"fifo", "srtf", "pack"}
    assert _pool("salus-share").open_ledger().leases() == []  # every policy's runner gave the device back


@pytest.mark.usefixtures("prefect_server")
def test_profiled_jobs_are_admitted_with_what_their_torch_work_allocates(state_dir):
    trace = [{"workload": "vgg16_100", "iterations": 4}, {"kind": "infer", "workload": "vgg19", "iterations": 4}]
    out = gpu_sharing(trace=trace, policies=["pack"], memory="profiled", mode="thread", pool=_pool("salus-profiled"),
                      tracking=False)
    declared = explicit_trace(trace)
    jobs = out["policies"]["pack"]["jobs"]
    # a digits MLP holds kilobytes to a few MB, not the gigabytes its Table A.1 workload declares
    assert all(0 < r["persistent_mb"] < 0.1 * d.persistent_mb for r, d in zip(jobs, declared))
    assert jobs[0]["persistent_mb"] > jobs[1]["persistent_mb"]  # the trainer's wider MLP and Adam state
    assert all(r["iterations"] == r["token_grants"] == 4 for r in jobs) and lane_overlaps(jobs) == []
    assert all(r["span_lanes"][0] != r["span_lanes"][-1] for r in jobs)  # profiled alone, then re-admitted
