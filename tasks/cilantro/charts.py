"""Cilantro's chart: per round, each job's allocation and the utility it measured (thesis §3.3, Fig. 3.3's loop)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from tasks.runtime.png import DPI, WIDTH_IN, pyplot, save_png


def rounds_figure(rows: Sequence[Mapping[str, Any]], title: str = ""):
    """``rows``: ``{"round", "allocation": {job: GPUs}, "utilities": {job: u}, "failed": [job]}`` per round. Left:
    each job's allocation per round (stacked); right: each job's utility per round (failed rounds marked x)."""
    plt = pyplot()

    jobs = list(dict.fromkeys(j for r in rows for j in r.get("allocation", {})))
    colour = {j: f"C{i % 10}" for i, j in enumerate(jobs)}
    xs = [r["round"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(WIDTH_IN, 5.0), dpi=DPI, layout="constrained")
    bottom = [0.0] * len(rows)
    for j in jobs:  # bars, not areas: an allocation holds for its whole round
        vals = [float(r["allocation"].get(j, 0.0)) for r in rows]
        left.bar(xs, vals, bottom=bottom, color=colour[j], width=0.7, edgecolor="black", linewidth=0.4, label=j)
        for x, b, v in zip(xs, bottom, vals):
            if v >= 0.08 and len(xs) <= 10:
                left.text(x, b + v / 2, f"{v:.2f}", ha="center", va="center", fontsize=9)
        bottom = [b + v for b, v in zip(bottom, vals)]
    left.set(xlabel="round", ylabel="GPUs allotted", title="allocation per job per round", xticks=xs)
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(4, len(jobs)), fontsize=10,
                frameon=False)
    for j in jobs:
        ys = [(r.get("utilities") or {}).get(j) for r in rows]
        right.plot(xs, [math.nan if y is None else y for y in ys], marker="o", color=colour[j], label=j)
        failed = [(x, 0.0) for x, r in zip(xs, rows) if j in (r.get("failed") or [])]
        if failed:
            right.scatter(*zip(*failed), marker="x", s=80, color=colour[j], zorder=3)
    right.set(xlabel="round", ylabel="utility (x: the job's task failed)", title="utility per job per round",
              xticks=xs)
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(4, len(jobs)), fontsize=10,
                 frameon=False)
    fig.suptitle(title or "Cilantro allocation rounds", fontsize=13)
    return fig


def rounds_png(rows: Sequence[Mapping[str, Any]], path: str | Path | None = None, title: str = "") -> Path:
    """Write :func:`rounds_figure` to ``path`` (default: a temporary file)."""
    return save_png(rounds_figure(rows, title), path, "cilantro-rounds.png")
