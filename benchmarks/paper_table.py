"""Print a benchmark's figures beside the paper's: one row per target, ours and the paper's value."""

from __future__ import annotations


def print_beside_paper(rows: list[tuple[str, str, str]]) -> None:
    """``rows`` of ``(target, ours, paper)``, aligned in three columns."""
    if not rows:
        return
    target = max(len(r[0]) for r in rows)
    ours = max(len(r[1]) for r in rows)
    print(f"{'target':<{target}}  {'ours':<{ours}}  paper")
    for name, value, paper in rows:
        print(f"{name:<{target}}  {value:<{ours}}  {paper}")
