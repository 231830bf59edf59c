"""What a reader sees: the table a flow run publishes to the Prefect UI (one row per period, nested decisions as
columns) and the demo commands' text tables."""

import json
import math

from tasks.report.tables import flat_row


def test_a_mapping_becomes_one_column_per_key_and_numbers_are_rounded_for_reading():
    row = flat_row({"window": 1, "accuracy": {"cam0": 0.812345678, "cam1": 0.7}, "failures": ["cam1"],
                    "bad_rate": math.nan, "replanned": True, "config": None})
    assert row == {"window": 1, "accuracy.cam0": 0.8123, "accuracy.cam1": 0.7, "failures": "cam1",
                   "bad_rate": None, "replanned": True, "config": None}
    json.dumps(row, allow_nan=False)  # every cell is plain JSON


def test_pool_demo_timeline_shows_the_gpus_a_task_held_and_explains_its_letters():
    """A 2-GPU task holds fraction 1.0 of each of its devices: the table says 2.00 GPUs, not 1.00."""
    from flows.pool_demo import format_timeline

    rows = [{"task": 0, "devices": [0], "fraction": 0.25, "memory": 0, "start": 0.0, "end": 1.0, "accuracy": 0.9},
            {"task": 1, "devices": [0, 1], "fraction": 1.0, "memory": 2**34, "start": 1.0, "end": 2.0, "accuracy": 0.8}]
    lines = format_timeline(rows, width=20).splitlines()
    assert lines[1].split()[:3] == ["0", "0.25", "0"] and lines[2].split()[:3] == ["1", "2.00", "0,1"]
    assert lines[4].startswith("gpu0 |A") and "B" in lines[5]  # gpu1 lane: only task 1
    assert "A = task 0" in lines[-1]


def test_demo_comparison_table_columns_line_up():
    from flows.demo import comparison_table

    window = {"mean": 0.5}
    table = comparison_table({p: {"windows": [window, window], "mean_accuracy": 0.5} for p in ("thief", "uniform")})
    rows = table.splitlines()[:4]  # header, two windows, all windows
    assert len({len(r) for r in rows}) == 1, rows


def test_a_flow_run_logs_its_outcome_with_the_headline_first_where_the_prefect_ui_opens_it(caplog):
    """The Prefect UI opens a flow run on its Logs tab: the outcome is a line of the flow run's logger there
    (tracking off too; Prefect's API handler ships that logger's records to the run's Logs tab), the system's
    headline metrics (its MLflow view's first columns) before the rest."""
    import logging
    import uuid

    from prefect import flow

    from flows.continuous_retraining import VIEW
    from tasks.runtime.flow import RunIdentity, log_flow_inputs, log_flow_outcome

    @flow(name=f"outcome-{uuid.uuid4().hex[:6]}")
    def tiny() -> str:
        from prefect.runtime import flow_run

        log_flow_inputs(RunIdentity("ekya", ("thief",)), {"policy": "thief"}, view=VIEW)
        log_flow_outcome({"tasks": 19, "windows_failed": 0, "mean_accuracy": 0.88125})
        return flow_run.id

    with caplog.at_level(logging.INFO, logger="prefect.flow_runs"):
        run_id = tiny()
    lines = [(r.getMessage(), str(getattr(r, "flow_run_id", ""))) for r in caplog.records
             if r.name == "prefect.flow_runs" and r.getMessage().startswith("outcome:")]
    assert lines == [("outcome: mean_accuracy=0.8812, windows_failed=0; tasks=19", run_id)]


def test_mlflow_links_open_the_ui_on_the_port_it_is_served_on(monkeypatch):
    """`make mlflow-ui MLFLOW_PORT=5391` serves the UI on 5391: the flow run's `mlflow-run` artifact links there
    (the Makefile passes the port as GPUFLOWS_MLFLOW_UI_URL) and says how to serve it; a tracking server is its
    own UI."""
    from tasks.runtime.flow import MLFLOW_UI_ENV, _link_markdown, mlflow_run_url

    monkeypatch.setenv(MLFLOW_UI_ENV, "http://127.0.0.1:5391/")
    assert mlflow_run_url("sqlite:///x.db", "2", "abc").startswith("http://127.0.0.1:5391/#/experiments/2/runs/abc?")
    assert mlflow_run_url("http://mlflow:5000", "2", "abc").startswith("http://mlflow:5000/#/")
    text = _link_markdown("sqlite:///x.db", "gpuflows-ekya", "2", "abc", "ekya-thief-2026-11-28T08:13:48")
    assert "--port 5391`" in text and "[ekya-thief-2026-11-28T08:13:48](http://127.0.0.1:5391/#/" in text
    link_texts = [part.split("](")[0] for part in text.split("[")[1:]]
    assert link_texts and not any("`" in t for t in link_texts)  # markdown shows backticks in a link's text as is
