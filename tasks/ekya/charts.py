"""Ekya's chart: per window, the GPUs each stream got for inference and retraining, beside the accuracy each stream
measured and the scheduler predicted (the thief scheduler's split, Algorithm 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from tasks.runtime.png import DPI, WIDTH_IN, pyplot, save_png


def split_figure(windows: Sequence[Mapping[str, Any]], title: str = ""):
    """``windows``: ``{"window", "split": {"<stream>/infer" | "<stream>/train": GPUs}, "accuracy": {stream: measured},
    "predicted": {stream: expected}}`` per window. Left: stacked GPUs per window (solid inference, hatched
    retraining, a colour per stream); right: measured (solid) and predicted (dashed) accuracy per stream."""
    plt = pyplot()
    from matplotlib.patches import Patch

    streams = sorted({s for w in windows for s in w["accuracy"]})
    colour = {s: f"C{i % 10}" for i, s in enumerate(streams)}
    xs = [w["window"] for w in windows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(WIDTH_IN, 5.6), dpi=DPI, layout="constrained")
    bottom = [0.0] * len(windows)
    for s in streams:
        for kind, hatch in (("infer", None), ("train", "//")):
            vals = [float(w["split"].get(f"{s}/{kind}", 0.0)) for w in windows]
            left.bar(xs, vals, bottom=bottom, color=colour[s], hatch=hatch, edgecolor="black", linewidth=0.5,
                     alpha=0.6 if kind == "train" else 0.9, width=0.6)
            for x, b, v in zip(xs, bottom, vals):
                if v >= 0.12 and len(xs) <= 6:
                    left.text(x, b + v / 2, f"{v:.2f}", ha="center", va="center", fontsize=9)
            bottom = [b + v for b, v in zip(bottom, vals)]
    left.set(xlabel="window", ylabel="GPUs at the window's start", xticks=xs,
             title="GPU split per stream\n(solid: inference, hatched: retraining)")
    left.legend(handles=[Patch(facecolor=colour[s], label=s) for s in streams]
                + [Patch(facecolor="white", edgecolor="black", hatch="//", label="retraining")],
                loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(5, len(streams) + 1), fontsize=10,
                frameon=False)
    for s in streams:
        right.plot(xs, [w["accuracy"].get(s) for w in windows], marker="o", color=colour[s], label=f"{s} measured")
        if any(w.get("predicted") for w in windows):
            right.plot(xs, [(w.get("predicted") or {}).get(s) for w in windows], marker="x", ls="--", lw=1,
                       color=colour[s], label=f"{s} predicted")
    means = [sum(w["accuracy"].values()) / max(1, len(w["accuracy"])) for w in windows]
    right.plot(xs, means, color="black", lw=2.5, marker="s", label="mean measured")
    right.set(xlabel="window", ylabel="inference accuracy", ylim=(0, 1.02), xticks=xs,
              title="accuracy per stream and window\n(solid: measured, dashed: predicted)")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=10, frameon=False)
    fig.suptitle(title or "Ekya: GPU split beside accuracy", fontsize=13)
    return fig


def split_png(windows: Sequence[Mapping[str, Any]], path: str | Path | None = None, title: str = "") -> Path:
    """Write :func:`split_figure` to ``path`` (default: a temporary file)."""
    return save_png(split_figure(windows, title), path, "ekya-split.png")
