"""The tables ``gpuflows simulate`` and the benchmarks print: within 120 columns, numbers as written (no ``NaN``, no
``1.98e+04``), and each benchmark row marked reproduced or missed beside the paper's figure, a miss saying why."""

from __future__ import annotations

import math

from benchmarks.paper_table import Row, paper_table
from gpu.report import WIDTH, SimulationReport, format_table


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_a_wide_simulator_table_fits_120_columns_and_reads_as_written():
    """Simulator tables were up to 207 characters wide with ``NaN`` and ``1.98e+04`` in them."""
    row = {"policy": "nexus_no_prefix_batching", "makespan_s": 19800.4, "missing": math.nan, "none": None,
           "note": "the paper reports this figure for the game workload only, not the traffic one " * 2}
    row |= {f"metric_{i:02d}_mean_latency_ms": 0.000123 * (i + 1) for i in range(12)}
    report = SimulationReport(system="nexus", table=[row, {**row, "policy": "nexus"}],
                              extra_tables={"per stream": [row]})
    text = report.format()
    assert _widest(text) <= WIDTH
    assert "NaN" not in text and "nan" not in text and "e+" not in text
    assert "19800" in text
    assert text.count("nexus_no_prefix_batching") >= 3  # the key column leads each block the columns continue in


def test_a_narrow_table_is_left_as_it_is():
    text = format_table([{"policy": "fifo", "jct_s": 12.5}, {"policy": "fluid", "jct_s": 3.25}])
    assert text.splitlines() == ["policy  jct_s", "fifo     12.5", "fluid    3.25"]


def test_benchmark_rows_say_which_reproduce_and_why_a_miss_differs():
    why = "synthetic streams, not the paper's videos"
    text = paper_table([Row("toy: thief accuracy", "72.8%", "73% (accept 66-76%)", True),
                        Row("capacity @0.75 thief", "2 -> 5", "2 -> 8", False, why),
                        Row("thief@4 vs uniform@16", "75.3% vs 78.1%", "thief@4 >= uniform@16", False, why),
                        Row("no retraining", "54%"),
                        ("an unconverted benchmark's row", "1.0", "2.0")])
    lines = text.splitlines()
    assert _widest(text) <= WIDTH
    assert lines[0].split() == ["target", "ours", "paper", "result"]
    assert lines[1].rstrip().endswith("reproduced")
    assert [line.rstrip()[-10:] for line in lines[2:4]] == ["missed [1]"] * 2  # one note for one reason
    assert f"[1] {why}" in lines
    assert lines[-1] == "1 reproduced, 2 missed, 1 not judged, 1 with no paper figure"
