"""The result every ``gpuflows simulate <system>`` command prints and writes as JSON, and the text tables it and the
benchmarks print.

One shape for all systems: a per-policy table (rows of plain values), optional extra tables
(per stream, per window ...), and a flat ``summary`` of headline figures with stable names.

Tables print within ``WIDTH`` (120) columns, whatever their width: a long text cell wraps inside its column, and a
table with more columns than fit continues below in blocks that repeat its first (key) column. Numbers read as
written: no ``1.98e+04``, and a missing value (None, NaN) is ``-``, not ``NaN``.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

WIDTH = 120  # columns of every printed table
GAP = "  "
WRAP = 40  # a text column wider than this (a note, a description) wraps, down to this width


def text_cell(value: Any) -> str:
    """A value as a table shows it: whole numbers whole, others to 4 significant digits without an exponent from
    0.001 up, None and NaN as ``-``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (math.isfinite(value) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e4:
        return f"{value:.0f}"
    return f"{value:.4g}" if magnitude >= 1e-3 else f"{value:.2g}"


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) or v is None for v in values)


def format_table(rows: Sequence[Mapping[str, Any]], width: int = WIDTH, caps: Mapping[str, int] | None = None) -> str:
    """``rows`` (mappings with the same keys) as aligned text within ``width`` columns: numbers right-aligned,
    text left-aligned; when the table would not fit, long text (over ``WRAP`` characters, never the first column)
    wraps in its column, and columns that still do not fit continue below in blocks led by the first column.
    ``caps``: columns that wrap at a width of their own whatever their content."""
    if not rows:
        return "(no rows)"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = {k: [text_cell(r.get(k)) for r in rows] for k in keys}
    right = {k: _numeric([r.get(k) for r in rows]) for k in keys}
    widths = {k: max(len(k), *(len(c) for c in cells[k])) for k in keys}
    widths |= {k: max(len(k), min(widths[k], cap)) for k, cap in (caps or {}).items() if k in widths}
    total = sum(widths.values()) + len(GAP) * (len(keys) - 1)
    for k in sorted((k for k in keys[1:] if not right[k] and widths[k] > WRAP), key=lambda k: -widths[k]):
        if total <= width:
            break
        fit = max(WRAP, len(k), widths[k] - (total - width))
        total -= widths[k] - fit
        widths[k] = fit
    blocks, block = [], [keys[0]]
    for k in keys[1:]:
        used = sum(widths[c] for c in block) + len(GAP) * len(block)
        if used + widths[k] > width and len(block) > 1:
            blocks.append(block)
            block = [keys[0]]
        block.append(k)
    blocks.append(block)
    out: list[str] = []
    for b in blocks:
        if out:
            out.append("")
        out.append(GAP.join(k.rjust(widths[k]) if right[k] else k.ljust(widths[k]) for k in b).rstrip())
        for i in range(len(rows)):
            lines = {k: textwrap.wrap(cells[k][i], widths[k], break_on_hyphens=False) or [""] for k in b}
            for j in range(max(len(v) for v in lines.values())):
                parts = [(lines[k][j] if j < len(lines[k]) else "") for k in b]
                out.append(GAP.join(p.rjust(widths[k]) if right[k] else p.ljust(widths[k])
                                    for k, p in zip(b, parts)).rstrip())
    return "\n".join(out)


@dataclass
class SimulationReport:
    system: str
    table: list[dict[str, Any]]
    summary: dict[str, float] = field(default_factory=dict)
    extra_tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def format(self) -> str:
        """Render the main table and the extra tables as aligned text within ``WIDTH`` columns."""
        parts = [f"== {self.system} ==", format_table(self.table)]
        for name, rows in self.extra_tables.items():
            parts += ["", f"-- {name} --", format_table(rows)]
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "table": self.table, "summary": self.summary, "extra_tables": self.extra_tables}

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, default=float))
