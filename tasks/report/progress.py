"""How far a long flow is: a progress bar in the terminal and a progress artifact in the Prefect UI."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext
from prefect.logging.handlers import PrefectConsoleHandler

from tasks.runtime.flow import flow_runner
from tasks.runtime.runners import GpuTaskRunner


def _console():
    """The rich Console of Prefect's console log handler, so a progress bar drawn on it stays below the log
    lines Prefect prints (rich moves a live display down past each print), else None."""
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
        runner = flow_runner()
    except Exception:  # noqa: BLE001
        return False
    return isinstance(runner, GpuTaskRunner) and runner.mode == "thread"


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
            try:
                self._console.print(self._progress.get_renderable())
            except (ValueError, OSError) as exc:  # the console's stream closed under us: no bar, the run goes on
                logging.getLogger(__name__).debug("progress bar not printed: %r", exc)
                self._progress = None
                return
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
