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
