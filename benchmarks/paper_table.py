"""Print a benchmark's figures beside the paper's: one row per target, ours, the paper's, and whether ours reproduces
it — within 120 columns (``gpu.report.format_table``), a miss saying why in one line (a numbered note under the table,
shared by the rows with the same reason).

    rows = [Row("1 toy: thief accuracy", f"{acc:.1%}", "73% (accept 66-76%)", 0.66 <= acc <= 0.76),
            Row("3 capacity @0.75 thief", "2 -> 5", "2 -> 8 (4x)", c2 >= 4 * c1,
                "synthetic streams saturate before 8"),
            Row("... no retraining", "61%")]                 # no paper figure: nothing to reproduce
    print_beside_paper(rows)

``reproduced`` is the row's own test of the paper's claim (a range, an ordering, a direction), written beside the
figure it judges; None where the paper gives no figure. A tuple ``(target, ours, paper)`` is a row not judged
(shown as such, for a benchmark that has not adopted verdicts yet).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Sequence

from gpu.report import WIDTH, format_table

REPRODUCED, MISSED, NO_FIGURE, NOT_JUDGED = "reproduced", "missed", "no paper figure", "not judged"
CAPS = {"target": 40, "ours": 26, "paper": 28}  # the result column takes the rest: "no paper figure [10]"


@dataclass(frozen=True)
class Row:
    """One figure: what it is, ours, the paper's ("-": none), and whether ours reproduces it, with why not."""

    target: str
    ours: str
    paper: str = "-"
    reproduced: bool | None = None
    why: str = ""  # a miss: why ours differs, in one line; else a note, optional

    @property
    def verdict(self) -> str:
        if self.reproduced is None:
            return NO_FIGURE if self.paper in ("", "-") else NOT_JUDGED
        return REPRODUCED if self.reproduced else MISSED


def judged(target: str, ours: str, paper: str, reproduced: bool, why: str = "") -> Row:
    """A row judged against the paper whose ``why`` (why ours differs) is shown only when it missed."""
    return Row(target, ours, paper, reproduced, "" if reproduced else why)


def as_row(row: Row | tuple[str, str, str]) -> Row:
    return row if isinstance(row, Row) else Row(*row)


def tally(rows: Sequence[Row | tuple[str, str, str]]) -> str:
    """``12 reproduced, 3 missed, 5 with no paper figure``: the line under the table."""
    verdicts = [as_row(r).verdict for r in rows]
    counts = [f"{n} {v}" for n, v in ((verdicts.count(v), v) for v in (REPRODUCED, MISSED, NOT_JUDGED)) if n]
    none = verdicts.count(NO_FIGURE)
    return ", ".join(counts + ([f"{none} with no paper figure"] if none else []))


def paper_table(rows: Sequence[Row | tuple[str, str, str]], width: int = WIDTH) -> str:
    """The rows as a table (target, ours, paper, result) within ``width`` columns (the columns wrap at ``CAPS`` only
    when the table would not fit), each row's why as a numbered note under it, then the tally."""
    notes: dict[str, int] = {}
    table = []
    for r in map(as_row, rows):
        mark = f" [{notes.setdefault(r.why, len(notes) + 1)}]" if r.why else ""
        table.append({"target": r.target, "ours": r.ours, "paper": r.paper, "result": r.verdict + mark})
    natural = sum(max(len(k), *(len(str(r[k])) for r in table)) for k in table[0]) + 3 * 2
    caps = None if natural <= width else {**CAPS, "result": width - sum(CAPS.values()) - 3 * 2}
    lines = [format_table(table, width, caps), *(textwrap.fill(f"[{n}] {why}", width, subsequent_indent="    ")
                                                 for why, n in notes.items()), tally(rows)]
    return "\n".join(lines)


def print_beside_paper(rows: Sequence[Row | tuple[str, str, str]]) -> None:
    """Print ``paper_table(rows)`` (nothing for no rows)."""
    if rows:
        print(paper_table(rows))
