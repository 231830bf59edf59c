"""What a flow run shows in the Prefect UI besides its task runs and logs: one table of its decisions.

MLflow keeps every number of a run; the Prefect UI is where an operator watches runs. Each flow publishes
its per-period decisions and outcomes (Ekya windows, Cilantro rounds, FLUID trials, Nexus epochs) as a
table artifact on its flow run, so the Artifacts tab answers "what did the scheduler decide, and how did
it go" without leaving Prefect.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

from prefect.artifacts import create_table_artifact


def _cell(value: Any) -> Any:
    """A JSON cell: floats to 4 significant digits (NaN/inf as None), anything structured as compact JSON."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return float(f"{value:.4g}") if math.isfinite(value) else None
    return json.dumps(value, separators=(",", ":"), default=str)


def flat_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One table row: a mapping value becomes one column per key (``accuracy.cam0``), the rest one cell each."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": _cell(v) for k, v in value.items()})
        else:
            out[key] = _cell(value)
    return out


def publish_table(key: str, rows: Iterable[Mapping[str, Any]], description: str) -> None:
    """Attach ``rows`` to the current flow run as the table artifact ``key`` (lowercase, digits, dashes)."""
    create_table_artifact([flat_row(r) for r in rows], key=key, description=description)
