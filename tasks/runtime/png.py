"""Charts as PNG files: matplotlib on its Agg backend (no display needed), one width and resolution for all.

Every chart of the project is drawn with these two helpers: the allocation timeline the task runner's tracker
logs (``tasks.runtime.tracking``), the report's charts (``tasks.report``), each system's own and the benchmarks'.
100 dpi and 1100 px wide: the Prefect UI's artifact pane in a 1600 px window shows a chart at full size, so its
10-13 pt text stays readable.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

DPI = 100
WIDTH_IN = 11.0  # 1100 px at DPI: the artifact pane of the Prefect UI at a 1600 px window


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend: charts are drawn to files, on machines without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | Path | None, default_name: str = "chart.png", dpi: int = DPI) -> Path:
    """Write ``fig`` as a PNG to ``path`` (its folder made; default: ``default_name`` in a new temporary folder)
    and close it, so a flow or benchmark drawing many charts does not keep them all in memory."""
    plt = pyplot()
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="gpuflows-chart-")) / default_name
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path
