"""The table a flow run publishes to the Prefect UI: one row per period, nested decisions as columns."""

import json
import math

from tasks.ui import flat_row


def test_a_mapping_becomes_one_column_per_key_and_numbers_are_rounded_for_reading():
    row = flat_row({"window": 1, "accuracy": {"cam0": 0.812345678, "cam1": 0.7}, "failures": ["cam1"],
                    "bad_rate": math.nan, "replanned": True, "config": None})
    assert row == {"window": 1, "accuracy.cam0": 0.8123, "accuracy.cam1": 0.7, "failures": "cam1",
                   "bad_rate": None, "replanned": True, "config": None}
    json.dumps(row, allow_nan=False)  # every cell is plain JSON
