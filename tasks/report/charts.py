"""A chart in the two places a reviewer looks: the flow run's Prefect UI and the flow's MLflow run.

A chart (a PNG drawn with ``tasks.runtime.png``) becomes a markdown artifact of the current flow run, embedding
the PNG as a data URI so it shows on the run's Artifacts tab without a file server, and ``charts/<file>`` of an
MLflow run, with a link to it under the chart. The charts themselves: the pool's occupancy
(``tasks.report.occupancy``) and each system's own (``tasks.<system>.charts``).
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path

from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext

from tasks.runtime.flow import mlflow_run_url

log = logging.getLogger(__name__)

MAX_INLINE_BYTES = 400_000  # larger PNGs are not embedded in the Prefect artifact (MLflow still gets them)


def publish_chart(path: Path, key: str, title: str, description: str, mlflow_run_id: str | None = None,
                  tracking_uri: str | None = None) -> None:
    """The PNG as the markdown artifact ``key`` of the current flow run (embedded as a data URI) and, given a
    run, as ``charts/<file>`` of that MLflow run. Either half failing is logged, never raised: a chart must
    not fail a flow that did its work."""
    data = Path(path).read_bytes()
    try:
        if FlowRunContext.get() is not None:
            where = _mlflow_where(Path(path).name, mlflow_run_id, tracking_uri)
            body = (f"![{title}](data:image/png;base64,{base64.b64encode(data).decode()})"
                    if len(data) <= MAX_INLINE_BYTES else f"*(chart of {len(data) // 1024} KiB: too big to embed)*")
            create_markdown_artifact(f"### {title}\n\n{body}\n\n{where}", key=key,
                                     description=description)
    except Exception as exc:  # noqa: BLE001
        log.warning("could not publish chart %s to Prefect: %r", key, exc)
    if mlflow_run_id and tracking_uri:
        try:
            from mlflow import MlflowClient

            MlflowClient(tracking_uri).log_artifact(mlflow_run_id, str(path), "charts")
        except Exception as exc:  # noqa: BLE001
            log.warning("could not log chart %s to MLflow run %s: %r", key, mlflow_run_id, exc)


def _mlflow_where(name: str, run_id: str | None, tracking_uri: str | None) -> str:
    """The line under a chart saying where MLflow keeps it: a link to the run's artifacts when the run's
    experiment can be read (the MLflow UI URL of ``tasks.runtime.flow.mlflow_run_url``), else the run id."""
    if not run_id:
        return ""
    run = f"`{run_id}`"
    if tracking_uri:
        try:
            from mlflow import MlflowClient

            got = MlflowClient(tracking_uri).get_run(run_id)
            run = f"[{got.info.run_name}]({mlflow_run_url(tracking_uri, got.info.experiment_id, run_id, 'artifacts')})"
        except Exception as exc:  # noqa: BLE001 - the id then
            log.debug("MLflow run %s not read for the chart's link: %r", run_id, exc)
    return f"Also `charts/{name}` of MLflow run {run}."
