"""The result every ``gpuflows simulate <system>`` command prints and writes as JSON.

One shape for all systems: a per-policy table (rows of plain values), optional extra tables
(per stream, per window ...), and a flat ``summary`` of headline figures with stable names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SimulationReport:
    system: str
    table: list[dict[str, Any]]
    summary: dict[str, float] = field(default_factory=dict)
    extra_tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def format(self) -> str:
        """Render the main table and the extra tables as aligned text."""
        import pandas as pd

        parts = [f"== {self.system} ==", pd.DataFrame(self.table).to_string(index=False, float_format=lambda v: f"{v:.4g}")]
        for name, rows in self.extra_tables.items():
            parts += ["", f"-- {name} --", pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}")]
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "table": self.table, "summary": self.summary, "extra_tables": self.extra_tables}

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, default=float))
