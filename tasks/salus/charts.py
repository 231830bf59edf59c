"""Salus's chart: per job, its queuing and a bar per Salus iteration, coloured by the lane it ran in (thesis Ch. 2:
one iteration at a time per lane, so bars of one colour never overlap)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from tasks.runtime.png import DPI, WIDTH_IN, pyplot, save_png


def lanes_figure(jobs: Sequence[Mapping[str, Any]], title: str = ""):
    """``jobs``: ``{"job", "lane", "arrival_s", "spans": [(start_s, end_s), ...]}`` per job (optionally
    ``span_lanes``, each iteration's lane when a job changed lanes). One row per job (first
    arrival on top): a grey line from its arrival to its first iteration (queuing), then a bar per iteration,
    coloured by the lane it ran in — bars of one colour never overlap (one iteration at a time per lane)."""
    plt = pyplot()
    from matplotlib.patches import Patch

    per_span = [j.get("span_lanes") or [j["lane"]] * len(j["spans"]) for j in jobs]
    lanes = sorted({lane for ls in per_span for lane in ls})
    cmap = plt.get_cmap("tab10" if len(lanes) <= 10 else "tab20")
    colour = {lane: cmap(i % cmap.N) for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(WIDTH_IN, max(3.0, 1.6 + 0.35 * len(jobs))), dpi=DPI, layout="constrained")
    for row, (j, span_lanes) in enumerate(zip(jobs, per_span)):
        spans = [(s, e - s) for s, e in j["spans"]]
        if spans:
            ax.hlines(row, j["arrival_s"], spans[0][0], colors="0.6", linewidth=1.5)
        ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=[colour[lane] for lane in span_lanes],
                       edgecolors="black", linewidth=0.2)
    ax.set_yticks(range(len(jobs)), [f"{j['job']} {j.get('workload', '')}".strip() for j in jobs], fontsize=9)
    ax.set_ylim(len(jobs) - 0.5, -0.5)
    ax.set_xlabel("seconds since the first arrival", fontsize=11)
    ax.grid(axis="x", color="0.85", lw=0.6)
    ax.set_axisbelow(True)
    ax.set_title(title or "Salus lanes: iterations per job", fontsize=12)
    fig.legend(handles=[Patch(facecolor=colour[lane], edgecolor="black", label=f"lane {lane}") for lane in lanes]
               + [Patch(facecolor="0.6", label="queued (arrival to first iteration)")],
               loc="outside lower center", ncol=min(6, len(lanes) + 1), fontsize=10, frameon=False)
    return fig


def lanes_png(jobs: Sequence[Mapping[str, Any]], path: str | Path | None = None, title: str = "") -> Path:
    """Write :func:`lanes_figure` to ``path`` (default: a temporary file)."""
    return save_png(lanes_figure(jobs, title), path, "salus-lanes.png")
