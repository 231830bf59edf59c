"""What a reviewer reads: the pool occupancy chart (lanes, legend, labels), its Prefect and MLflow copies,
Ekya's and Cilantro's charts, tables without 16-digit floats or 23 columns, and the progress display."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from gpu.devices import discover
from tasks.cilantro.charts import rounds_figure as cilantro_rounds_figure
from tasks.ekya.charts import split_figure as ekya_split_figure
from tasks.ekya.records import window_rows as ekya_window_rows
from tasks.report.holders import holder_names, register_holder
from tasks.report.occupancy import lease_intervals, occupancy_figure
from tasks.report.progress import FlowProgress
from tasks.report.tables import flat_row

A, B, C = "host:100:aaaa", "host:200:bbbb", "host:300:cccc"


def _events() -> list[dict]:
    node = discover("3x16GiB", "simulated").nodes[0].name
    out: list[dict] = []

    def lease(lid, label, devices, fraction, start, end, holder, end_kind="release"):
        base = dict(lease_id=lid, label=label, node=node, devices=json.dumps(devices), fraction=fraction, memory=0,
                    holder=holder, reason="")
        out.append({**base, "id": len(out) + 1, "t": 1000.0 + start, "kind": "allocate"})
        if end is not None:
            out.append({**base, "id": len(out) + 1, "t": 1000.0 + end, "kind": end_kind})

    lease("l1", "retrain cam0", [0], 0.5, 0, 30, A)
    lease("l2", "infer cam0", [0], 0.5, 5, 25, A)
    lease("l3", "trial c0001@0", [1], 0.25, 10, 40, B)
    lease("l4", "svc-a", [0, 1], 1.0, 45, None, C)          # still held at the chart's end
    lease("l5", "old", [1], 1.0, -50, -20, B)                # before the window: left out
    lease("l6", "cut", [2], 1.0, 50, 58, C, "reclaim")
    return out


def test_lease_intervals_pair_allocate_with_release_and_clip_to_the_window():
    leases = {x["lease_id"]: x for x in lease_intervals(_events(), since_t=1000.0, until_t=1060.0)}
    assert set(leases) == {"l1", "l2", "l3", "l4", "l6"}
    assert leases["l1"]["start"] == 1000.0 and leases["l1"]["end"] == 1030.0 and not leases["l1"]["open"]
    assert leases["l4"]["open"] and leases["l4"]["end"] == 1060.0 and leases["l4"]["devices"] == [0, 1]
    assert leases["l6"]["end_kind"] == "reclaim"


def test_occupancy_chart_has_a_lane_per_device_a_legend_entry_per_holder_and_lease_labels():
    import matplotlib.pyplot as plt

    spec = discover("3x16GiB", "simulated")
    fig = occupancy_figure(_events(), spec, names={A: "clever-fox", B: "brave-owl"}, pool="ekya",
                           since_t=1000.0, until_t=1060.0, highlight=A)
    try:
        ax = fig.axes[0]
        lanes = [t.get_text() for t in ax.get_yticklabels()]
        assert lanes == [f"{spec.nodes[0].name}/gpu{i}" for i in range(3)]
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert legend[:3] == ["clever-fox (pid 100) — this flow", "brave-owl (pid 200)", "pid 300"]
        assert "still held at the chart's end" in legend
        assert fig.legends[0].get_title().get_text() == "holder (flow run)"
        texts = {t.get_text() for t in ax.texts}
        assert {"retrain cam0", "infer cam0", "trial c0001@0", "svc-a", "cut (reclaimed)"} <= texts
        assert "Pool ekya" in ax.get_title() and ax.get_xlabel().startswith("wall-clock seconds since")
        assert "wall-clock" in ax.get_title()  # not the slice time of a flow's own charts
        assert "device" in ax.get_ylabel()
        assert fig.get_size_inches()[0] * fig.dpi == 1100  # the artifact pane of the Prefect UI at 1600 px
    finally:
        plt.close(fig)


def test_stacked_slices_of_one_device_do_not_overlap():
    import matplotlib.pyplot as plt

    fig = occupancy_figure(_events(), discover("3x16GiB", "simulated"), since_t=1000.0, until_t=1060.0)
    try:
        bars = [c.get_paths()[0].get_extents() for c in fig.axes[0].collections]
        lane0 = [b for b in bars if b.y0 < 0.5 and b.x0 < 40]  # l1 and l2, both on gpu0 over 5..25 s
        assert len(lane0) == 2
        low, high = sorted(lane0, key=lambda b: b.y0)
        assert low.y1 <= high.y0 + 1e-9
    finally:
        plt.close(fig)


def test_holders_are_named_by_the_flow_runs_that_registered_them(state_dir):
    register_holder(A, "clever-fox", "ekya")
    assert holder_names([A, B]) == {A: "clever-fox"}


def test_ekya_and_cilantro_charts_have_both_panels_labelled():
    import matplotlib.pyplot as plt

    windows = [{"window": w, "split": {"cam0/infer": 0.5, "cam0/train": 0.5, "cam1/infer": 1.0},
                "accuracy": {"cam0": 0.7, "cam1": 0.8}, "predicted": {"cam0": 0.75, "cam1": 0.8}} for w in range(2)]
    rows = [{"round": r, "allocation": {"svc-a": 0.4, "trainer": 0.6}, "utilities": {"svc-a": 0.9, "trainer": 0.3},
             "failed": []} for r in range(3)]
    for fig in (ekya_split_figure(windows), cilantro_rounds_figure(rows)):
        try:
            left, right = fig.axes
            assert left.get_xlabel() and left.get_ylabel() and right.get_ylabel() and left.get_title()
            assert left.get_legend().get_texts() and right.get_legend().get_texts()
        finally:
            plt.close(fig)


def test_fluid_table_has_no_16_digit_floats():
    row = flat_row({"trial": "c0001@0", "config": {"lr": 0.1, "hidden": 16}, "val_accuracy": 0.9666666666666667,
                    "gpu_widths": [1 / 3, 0.5], "failed": False})
    text = json.dumps(row)
    assert not re.search(r"\d\.\d{5,}", text), text
    assert row["gpu_widths"] == "0.333, 0.5"


def test_ekya_table_is_one_row_per_window_and_stream_at_most_8_columns():
    """The retraining columns are the window's job, also one the thief started mid-window (cam1 in window 1: no
    GPUs at the window's start, 0.6 from 0.42 s), as the window's MLflow run records it."""
    def job(stream: str, gpus: float, start: float, outcome: str) -> SimpleNamespace:
        return SimpleNamespace(stream=stream, config=SimpleNamespace(name="e5-all-d50"), gpus=gpus, start=start,
                               outcome=outcome)

    results = [SimpleNamespace(window=w, measured={f"cam{i}": 0.81234567 for i in range(4)},
                               predicted={f"cam{i}": 0.8 for i in range(4)},
                               start_alloc={"cam0/infer": 0.25, "cam0/train": 0.5, "cam1/infer": 0.25},
                               jobs=[job("cam0", 0.5, 0.0, "COMPLETED")] + ([job("cam1", 0.6, 0.42, "FAILED")] if w
                                                                           else [])) for w in range(2)]
    rows = ekya_window_rows(results)
    assert len(rows) == 8 and all(len(r) <= 8 for r in rows)
    assert list(rows[0])[:3] == ["window", "stream", "retrain_config"]  # the decision first
    assert rows[5] == {"window": 1, "stream": "cam1", "retrain_config": "e5-all-d50", "retrain_gpus": 0.6,
                       "retraining": "failed from 0.42 s", "infer_gpus": 0.25, "predicted": 0.8, "measured": 0.8123}
    assert rows[1]["retraining"] == "none" and rows[1]["retrain_gpus"] == 0.0


def test_progress_outside_a_flow_and_without_a_terminal_is_harmless():
    with FlowProgress("t", 3, "test", unit="steps") as p:
        for _ in range(3):
            p.advance(note="ok")
    with FlowProgress("u", None, "unknown total") as p:
        p.update(2, "running 1")
    assert p.completed == 2


@pytest.mark.usefixtures("prefect_server")
def test_a_flow_run_publishes_its_pool_occupancy_to_prefect_and_mlflow(state_dir):
    from mlflow import MlflowClient
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.context import get_run_context

    from resource_blocks import GpuPool, MlflowTarget
    from tasks.report.occupancy import publish_pool_occupancy
    from tasks.runtime.requests import gpu_options
    from tasks.runtime.runners import GpuTaskRunner, flow_mlflow_run_id

    @task
    def work(i: int) -> int:
        return i

    target = MlflowTarget(experiment="charts-test")
    pool = GpuPool(name="charts-occ", device_backend="simulated", simulated="2x16GiB")

    @flow(task_runner=GpuTaskRunner(pool=pool, mode="thread", tracking=target))
    def occupied():
        with FlowProgress("occupied", 2, "work", unit="tasks") as progress:
            for i, stream in enumerate(("cam0", "cam1")):
                with gpu_options(gpus=0.5, label=f"infer {stream}"):
                    work.submit(i).result()
                progress.advance()
        return flow_mlflow_run_id(), publish_pool_occupancy(), get_run_context().flow_run.id

    parent, png, flow_run_id = occupied()
    assert png is not None and png.stat().st_size < 200_000
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["pool-occupancy", "progress-occupied"])))
    by_key = {a.key: a for a in found if a.flow_run_id == flow_run_id}
    assert by_key["pool-occupancy"].type == "markdown"  # one name for every pool: MLflow compares runs' charts
    assert "### Pool charts-occ: occupancy" in by_key["pool-occupancy"].data  # the pool is in the title
    assert "](data:image/png;base64," in by_key["pool-occupancy"].data
    run = MlflowClient(target.resolved_uri()).get_run(parent)  # the line under the chart links the MLflow run
    assert (f"/#/experiments/{run.info.experiment_id}/runs/{parent}/artifacts?workflowType=machine_learning)"
            in by_key["pool-occupancy"].data)
    assert by_key["progress-occupied"].type == "progress" and float(by_key["progress-occupied"].data) == 100.0
    client = MlflowClient(target.resolved_uri())
    assert "charts/pool-occupancy.png" in [a.path for a in client.list_artifacts(parent, "charts")]
