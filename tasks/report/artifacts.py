"""What a flow run shows in the Prefect UI besides its task runs and logs: its decisions, charts and progress.

MLflow keeps every number of a run; the Prefect UI is where an operator watches runs. Each flow publishes
its per-period decisions and outcomes (Ekya windows, Cilantro rounds, FLUID trials, Nexus epochs) as a
table artifact on its flow run, so the Artifacts tab answers "what did the scheduler decide, and how did
it go" without leaving Prefect; charts (``tasks.report.charts``) sit beside the tables, and :class:`FlowProgress`
shows how far a long flow is, in the terminal and as a progress artifact.

Tables are for reading at 1600 px: numbers are rounded (4 significant digits, 3 inside lists), lists and
mappings inside a cell are short text (``0.333, 0.5``; ``lr=0.01 hidden=16``), and wide per-stream layouts
are turned into one row per period and stream (:func:`ekya_window_rows`).
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import threading
import time
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


def _cell(value: Any) -> Any:
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
            out.update({f"{key}.{k}": _cell(v) for k, v in value.items()})
        else:
            out[key] = _cell(value)
    return out


def publish_table(key: str, rows: Iterable[Mapping[str, Any]], description: str) -> None:
    """Attach ``rows`` to the current flow run as the table artifact ``key`` (lowercase, digits, dashes)."""
    create_table_artifact([flat_row(r) for r in rows], key=key, description=description)


def ekya_window_rows(results: Iterable[Any]) -> list[dict[str, Any]]:
    """Ekya's table: one row per window and stream, the decision first, 8 columns.

    Laid out per window, every stream added 5 columns (measured, predicted, config, inference and
    retraining GPUs): 23 with 4 streams, the decisions off-screen at 1600 px. Per window and stream the
    table stays 8 columns wide whatever the number of streams; a window's streams are adjacent rows, so
    the split between them reads down the GPU columns. ``results``: ``tasks.ekya.window.WindowResult``.
    """
    rows = []
    for r in results:
        for stream in r.measured:
            rows.append({"window": r.window, "stream": stream, "retrain_config": r.configs.get(stream) or "none",
                         "retrain_gpus": _cell(float(r.start_alloc.get(f"{stream}/train", 0.0))),
                         "infer_gpus": _cell(float(r.start_alloc.get(f"{stream}/infer", 0.0))),
                         "predicted": _cell(r.predicted.get(stream)), "measured": _cell(r.measured[stream]),
                         "failed": stream in r.failures})
    return rows


def publish_ekya_windows(policy: str, results: list[Any], parent: str | None = None,
                         tracking_uri: str | None = None) -> None:
    """Ekya's table (``ekya-windows-<policy>``) and its chart (``ekya-split-<policy>``: the GPU split per
    stream beside accuracy per window, also ``charts/`` of the flow's MLflow run ``parent``)."""
    publish_table(f"ekya-windows-{policy}", ekya_window_rows(results),
                  f"Ekya {policy}: per window and stream, the retraining configuration chosen and the GPUs allotted at "
                  "the window's start, then the accuracy predicted and measured")
    from tasks.report.charts import ekya_split_png, publish_chart

    windows = [{"window": r.window, "split": dict(r.start_alloc), "accuracy": dict(r.measured),
                "predicted": dict(r.predicted)} for r in results]
    try:
        png = ekya_split_png(windows, title=f"Ekya {policy}: GPU split beside accuracy")
    except Exception as exc:  # noqa: BLE001 - a chart never fails the flow
        logging.getLogger(__name__).warning("could not draw Ekya's split chart: %r", exc)
        return
    publish_chart(png, f"ekya-split-{policy}", f"Ekya {policy}: GPU split per stream beside accuracy per window",
                  "Left: GPUs each stream got at each window's start, for inference (solid) and retraining "
                  "(hatched); right: accuracy measured (solid) and predicted (dashed).", parent, tracking_uri)


def publish_cilantro_rounds(run_name: str, policy: str, rows: list[dict[str, Any]], parent: str | None = None,
                            tracking_uri: str | None = None) -> None:
    """Cilantro's table (``cilantro-rounds-<run>``) and chart (``cilantro-rounds-chart-<run>``, also
    ``charts/`` of the flow's MLflow run ``parent``): allocation and utility per job per round."""
    publish_table(f"cilantro-rounds-{run_name}", [
        {k: row[k] for k in ("round", "allocation", "utilities", "social_welfare", "egalitarian_welfare",
                             "njc_fairness", "decision_s", "failed") if k in row} for row in rows],
        f"Cilantro {policy}: GPU units allotted per job, the utilities they measured and the welfare/fairness "
        "of each round")
    from tasks.report.charts import cilantro_rounds_png, publish_chart

    try:
        png = cilantro_rounds_png(rows, title=f"Cilantro {policy}, run {run_name}")
    except Exception as exc:  # noqa: BLE001 - a chart never fails the flow
        logging.getLogger(__name__).warning("could not draw Cilantro's rounds chart: %r", exc)
        return
    publish_chart(png, f"cilantro-rounds-chart-{run_name.lower().replace('_', '-').replace('.', '-')}",
                  f"Cilantro {policy}: allocation and utility per job per round",
                  "Left: GPU units each job held per round; right: the utility it measured (x: its task failed).",
                  parent, tracking_uri)


def _console():
    """The rich Console of Prefect's console log handler, so a progress bar drawn on it stays below the log
    lines Prefect prints (rich moves a live display down past each print), else None."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for name in ("prefect.flow_runs", "prefect", ""):
        logger = logging.getLogger(name)
        while logger is not None:
            for handler in logger.handlers:
                if isinstance(handler, PrefectConsoleHandler):
                    return handler.console
            logger = logger.parent if logger.propagate else None
    return None


def _logs_through_this_console() -> bool:
    """Whether the current flow run's task logs are printed by this process (GPU task runner in thread mode)."""
    try:
        from tasks.runtime.flow import flow_runner

        runner = flow_runner()
    except Exception:  # noqa: BLE001
        return False
    return runner is not None and type(runner).__name__ == "GpuTaskRunner" and getattr(runner, "mode", "") == "thread"


class FlowProgress:
    """How far a long flow is: a rich progress bar in the terminal and a progress artifact in the Prefect UI.

    The bar is drawn on the console of Prefect's own log handler. When every log line of the run goes through
    that console (the GPU task runner in ``thread`` mode) it is a live bar kept below the log lines (rich moves
    it down past each print: what a ``\\r`` line cannot do). Worker processes (``process`` mode, Ray) write
    their task logs straight to the terminal, past any console, so there the bar is printed as a whole line of
    its own at each step (at most every ``LINE_EVERY_S`` seconds, and at the end): lines interleave, never
    their characters. Off a terminal the same lines go to the log stream. ``total`` None: a count without a
    percentage (no progress artifact). Use as a context manager (or ``start()`` ... ``close()``); ``advance`` /
    ``update`` as the work goes. The bar is redrawn on updates only (no refresh thread) and stops by itself
    when ``total`` is reached; the artifact is updated by a thread (an API call per update would slow the
    serving flow's beacons), which ends on ``close`` or after 10 idle minutes (a flow that raised half-way).
    """

    LINE_EVERY_S = 5.0

    def __init__(self, key: str, total: float | None, description: str, terminal: bool = True, unit: str = ""):
        self.key, self.total, self.description, self.terminal, self.unit = key, total, description, terminal, unit
        self.completed = 0.0
        self._progress = self._task = self._artifact = None
        self._pending: tuple[float, str] | None = None
        self._wake = threading.Event()
        self._closing = False
        self._poster: threading.Thread | None = None
        self._live = False
        self._console = None
        self._printed_at = 0.0
        self._printed = -1.0

    def start(self) -> "FlowProgress":
        return self.__enter__()

    def __enter__(self) -> "FlowProgress":
        if self.terminal:
            console = _console()
            if console is not None:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

                # explicit styles: the theme of Prefect's console lacks rich's defaults (``bar.back``, ...)
                self._progress = Progress(TextColumn("{task.description}", style="bold"),
                                          BarColumn(style="grey37", complete_style="green", finished_style="green",
                                                    pulse_style="cyan"),
                                          MofNCompleteColumn(), TextColumn(self.unit, style="none"),
                                          TextColumn("{task.fields[note]}", style="none"),
                                          TimeElapsedColumn(), console=console, transient=False,
                                          auto_refresh=False)
                self._console = console
                self._task = self._progress.add_task(self.description, total=self.total, note="")
                self._live = console.is_terminal and _logs_through_this_console()
                if self._live:
                    try:
                        self._progress.start()
                    except Exception as exc:  # noqa: BLE001 - e.g. another live display on this console
                        logging.getLogger(__name__).debug("no live progress bar: %r", exc)
                        self._live = False
        if self.total:
            try:
                from prefect.artifacts import create_progress_artifact
                from prefect.context import FlowRunContext

                if FlowRunContext.get() is not None:
                    self._artifact = create_progress_artifact(0.0, key=f"progress-{self.key}",
                                                              description=self.description)
                    self._start_poster()
            except Exception as exc:  # noqa: BLE001 - progress is a courtesy
                logging.getLogger(__name__).debug("no progress artifact: %r", exc)
        return self

    def update(self, completed: float, note: str = "") -> None:
        """Set the amount done (and a short note: what is running, what failed)."""
        self.completed = completed
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, note=note, refresh=self._live)
            done = bool(self.total) and completed >= self.total
            if not self._live and (done or time.monotonic() - self._printed_at >= self.LINE_EVERY_S):
                self._print_line()
        if self._poster is not None and self.total:  # posted by a thread: never slows the flow down
            self._pending = (min(100.0, 100.0 * completed / self.total),
                             f"{self.description}: {completed:g}/{self.total:g} {self.unit} {note}".rstrip())
            self._wake.set()
            if not self._poster.is_alive():
                self._start_poster()
        if self.total and completed >= self.total:
            self.close()

    def advance(self, amount: float = 1.0, note: str = "") -> None:
        self.update(self.completed + amount, note)

    def _start_poster(self) -> None:
        ctx = contextvars.copy_context()  # the flow run's Prefect settings and client
        self._poster = threading.Thread(target=ctx.run, args=(self._post_loop,), daemon=True, name="gpuflows-progress")
        self._poster.start()

    def _post_loop(self) -> None:
        from prefect.artifacts import update_progress_artifact

        while True:
            if not self._wake.wait(600):
                return
            self._wake.clear()
            pending, self._pending = self._pending, None
            if pending is not None:
                try:
                    update_progress_artifact(self._artifact, pending[0], description=pending[1])
                except Exception as exc:  # noqa: BLE001 - progress is a courtesy
                    logging.getLogger(__name__).debug("progress artifact not updated: %r", exc)
            if self._closing and self._pending is None:
                return

    def _print_line(self) -> None:
        """The bar as one whole line, printed like a log line (one write)."""
        if self._progress is not None and self._printed != self.completed:
            self._console.print(self._progress.get_renderable())
            self._printed_at, self._printed = time.monotonic(), self.completed

    def close(self) -> None:
        """Stop the bar; the progress artifact gets its last value (waits for it up to 10 s)."""
        if self._progress is not None:
            if self._live:
                self._progress.stop()
            else:
                self._print_line()
            self._progress = None
        if self._poster is not None:
            self._closing = True
            self._wake.set()
            if self._poster is not threading.current_thread():
                self._poster.join(10)
            self._poster = None

    def __exit__(self, *exc: Any) -> None:
        self.close()
