"""Tables a flow run shows in the Prefect UI: its per-period decisions and outcomes, readable at 1600 px.

MLflow keeps every number of a run; the Prefect UI is where an operator watches runs. Each flow publishes its
per-period decisions and outcomes (windows, rounds, trials, epochs, jobs) as a table artifact of its flow run
(through ``tasks.report.records.Records.table``, which also keeps the rows as JSON in MLflow), so the Artifacts tab
answers "what did the scheduler decide, and how did it go" without leaving Prefect. Numbers are rounded (4
significant digits, 3 inside lists) and lists and mappings inside a cell are short text (``0.333, 0.5``;
``lr=0.01 hidden=16``); a system with a wide per-stream layout turns it into one row per period and stream first,
so the table stays a few columns wide whatever the number of streams.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

from prefect.artifacts import create_table_artifact


def _short(value: Any) -> str:
    """A value inside a cell as short text: floats to 3 significant digits, lists comma-separated,
    mappings as ``k=v`` pairs."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.3g}" if math.isfinite(value) else "n/a"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, Mapping):
        return " ".join(f"{k}={_short(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(_short(v) for v in value)
    return str(value)


def cell(value: Any) -> Any:
    """A JSON cell: floats to 4 significant digits (NaN/inf as None), lists and mappings as short text."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return float(f"{value:.4g}") if math.isfinite(value) else None
    return _short(value)


def flat_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One table row: a mapping value becomes one column per key (``accuracy.cam0``), the rest one cell each."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": cell(v) for k, v in value.items()})
        else:
            out[key] = cell(value)
    return out


def publish_table(key: str, rows: Iterable[Mapping[str, Any]], description: str) -> None:
    """Attach ``rows`` to the current flow run as the table artifact ``key`` (lowercase, digits, dashes)."""
    create_table_artifact([flat_row(r) for r in rows], key=key, description=description)
