"""The one way a system publishes what its flow run did: MLflow runs nested under the flow's run, Prefect tables
and charts on the flow run. A system's ``records.py`` says *what* it records; this module says *how*.

    records = Records.of_flow()                        # the flow's MLflow run; every call a no-op when off
    run = records.nested("<system>-<policy>", {"policy": policy})
    records.log(run, params={"jobs": 8}, metrics={"makespan_s": 12.5})
    records.json(run, rows, "jobs.json")
    records.finish(run)
    records.table("<system>-jobs", rows, "one row per job")            # Prefect table + tables/<key>.json
    records.chart(png, "<system>-chart", title, description, run)      # Prefect markdown + charts/<file>

Every nested run carries its holder's host and pid (``tasks.runtime.tracking.holder_tags``), so a later tracker
marks the runs of a process that died KILLED. A tracking store that fails costs the record, not the flow: run the
calls under ``kept(what)``, which keeps the error in ``errors`` (the flow returns them) and logs it.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from tasks.report.charts import publish_chart
from tasks.report.tables import flat_row, publish_table
from tasks.runtime.tracking import ensure_experiment, flow_tracker, holder_tags, open_client, register_model_version

log = logging.getLogger(__name__)

TORCH_REQUIREMENT = "torch==2.13.0"
"""The requirement a logged torch model declares (explicit: no inference, no ``+cpu`` label)."""


class _DropPickleWarning(logging.Filter):
    """Drops mlflow.pytorch's one warning that pickle serialisation can run code on load: these models are
    ours, written and read by this project (pickle keeps the loaded model the same nn.Module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Saving pytorch model by Pickle or CloudPickle format")


class Records:
    """A system's records of one flow run, nested under the MLflow run ``parent`` on ``tracking_uri``.

    ``experiment``: where nested runs go (default: the parent's experiment). Without a parent (tracking off)
    every MLflow call is a no-op returning None; tables and charts still go to the Prefect UI.
    """

    def __init__(self, tracking_uri: str | None, parent: str | None, experiment: str | None = None):
        self.tracking_uri = tracking_uri
        self.parent = parent if tracking_uri else None
        self.errors: list[str] = []
        self._experiment = experiment
        self._experiment_id: str | None = None
        self._client: Any = None
        self._own = False

    @classmethod
    def of_flow(cls, timeout: float = 60.0) -> "Records":
        """The current flow run's records: under the MLflow run its GPU task runner opened (none: tracking off)."""
        tracker = flow_tracker()
        parent = tracker.wait_parent(timeout) if tracker is not None else None
        return cls(tracker.tracking_uri if tracker is not None else None, parent)

    @classmethod
    def own_run(cls, tracking_uri: str, experiment: str, run_name: str) -> "Records":
        """Records under a run of their own in ``experiment`` (for work no GPU task runner tracked); ``close``
        ends it."""
        records = cls(tracking_uri, None, experiment)
        records.parent = records.client.create_run(records.experiment_id, run_name=run_name,
                                                   tags=holder_tags()).info.run_id
        records._own = True
        return records

    @property
    def enabled(self) -> bool:
        return self.parent is not None

    @property
    def client(self) -> Any:
        """The ``MlflowClient`` (opened on first use, its store initialised once per process)."""
        if self._client is None:
            self._client = open_client(self.tracking_uri)
        return self._client

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = ensure_experiment(self.client, self._experiment) if self._experiment else \
                self.client.get_run(self.parent).info.experiment_id
        return self._experiment_id

    @contextmanager
    def kept(self, what: str) -> Iterator[None]:
        """Run MLflow calls whose failure must not fail the flow: the error is kept (``errors``) and logged."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - any store error costs the record, not the flow
            self.errors.append(f"{what}: {exc!r}")
            try:  # where the flow run's logs go (its Prefect UI page)
                get_run_logger().error(self.errors[-1])
            except MissingContextError:
                log.error(self.errors[-1])

    # -- MLflow runs ----------------------------------------------------------------------------------------
    def nested(self, name: str, tags: Mapping[str, Any] | None = None, *, parent: str | None = None,
               start_time: int | None = None) -> str | None:
        """A new run named ``name`` nested under ``parent`` (default: the flow's run), tagged with ``tags`` and
        its holder; returns its id (None when tracking is off)."""
        if not self.enabled:
            return None
        tags = {"mlflow.parentRunId": parent or self.parent, **holder_tags(),
                **{k: str(v) for k, v in (tags or {}).items()}}
        return self.client.create_run(self.experiment_id, run_name=name, start_time=start_time, tags=tags).info.run_id

    def log(self, run_id: str | None = None, *, params: Mapping[str, Any] | None = None,
            metrics: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None, step: int = 0,
            series: Iterable[tuple[str, float, int]] = (), timestamp: int | None = None) -> None:
        """Params and tags (as text), ``metrics`` (numbers; None skipped) at ``step`` and ``series`` (``(key,
        value, step)`` triples) to ``run_id`` (default: the flow's run), in one batch (MLflow splits it at its
        limits). ``timestamp``: ms since the epoch (default now)."""
        run_id = run_id or self.parent
        if not self.enabled or run_id is None:
            return
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000) if timestamp is None else timestamp
        points = [(k, v, step) for k, v in (metrics or {}).items() if v is not None] + list(series)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, s) for k, v, s in points],
                              params=[Param(k, str(v)[:6000]) for k, v in (params or {}).items()],
                              tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()])

    def json(self, run_id: str | None, obj: Any, path: str) -> None:
        """``obj`` as the JSON artifact ``path`` of ``run_id`` (default: the flow's run)."""
        if self.enabled:
            self.client.log_dict(run_id or self.parent, obj, path)

    def text(self, run_id: str | None, text: str, path: str) -> None:
        if self.enabled:
            self.client.log_text(run_id or self.parent, text, path)

    def file(self, run_id: str | None, local: str | Path, folder: str | None = None) -> None:
        """A local file as an artifact of ``run_id`` (default: the flow's run), in ``folder``."""
        if self.enabled:
            self.client.log_artifact(run_id or self.parent, str(local), folder)

    def model(self, run_id: str, model: Any, artifact: str, registered: str) -> str | None:
        """Log torch ``model`` (pickled: the loaded model is the same nn.Module) as ``artifact`` of ``run_id`` and
        register it as a new version of ``registered``; returns the version (None when tracking is off)."""
        if not self.enabled:
            return None
        import mlflow
        import mlflow.pytorch

        mlflow.set_tracking_uri(self.tracking_uri)
        warning = logging.getLogger("mlflow.pytorch")
        quiet = _DropPickleWarning()
        warning.addFilter(quiet)
        try:
            with mlflow.start_run(run_id=run_id):
                info = mlflow.pytorch.log_model(model, name=artifact, serialization_format="pickle",
                                                pip_requirements=[TORCH_REQUIREMENT])
        finally:
            warning.removeFilter(quiet)
        return register_model_version(self.client, registered, info, run_id)

    def finish(self, run_id: str | None, status: str = "FINISHED") -> None:
        if self.enabled and run_id is not None:
            self.client.set_terminated(run_id, status)

    def close(self) -> None:
        """End the run of our own (``own_run``); a flow's run is ended by its task runner."""
        if self._own:
            self.finish(self.parent)

    # -- the Prefect UI, and the same in MLflow -------------------------------------------------------------
    def table(self, key: str, rows: Iterable[Mapping[str, Any]], description: str, run_id: str | None = None) -> None:
        """``rows`` as the table artifact ``key`` of the current flow run (``tasks.report.tables``) and, tracking
        on, as ``tables/<key>.json`` of ``run_id`` (default: the flow's run), the cells as the table shows them."""
        rows = [flat_row(r) for r in rows]
        publish_table(key, rows, description)
        with self.kept(f"table {key} not logged to MLflow"):
            self.json(run_id, rows, f"tables/{key}.json")

    def chart(self, png: Path | None, key: str, title: str, description: str, run_id: str | None = None) -> None:
        """A chart (None: it could not be drawn) as the markdown artifact ``key`` of the current flow run and
        ``charts/<file>`` of ``run_id`` (default: the flow's run); never raises."""
        if png is not None:
            publish_chart(png, key, title, description, run_id or self.parent,
                          self.tracking_uri if self.enabled else None)
