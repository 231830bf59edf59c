"""MLflow tracking for task runners: a flow run is an MLflow run, each placed task a nested run.

Everything is logged from one background thread through ``MlflowClient`` so tracking never
blocks task execution; ``close()`` drains the queue so nothing logged is lost. The allocation
timeline (which task held which slice when) is logged as a table and a Gantt-chart PNG.
"""

from __future__ import annotations

import json
import logging
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu.state import state_dir

log = logging.getLogger("gpuflows.tracking")


def default_tracking_uri() -> str:
    return f"sqlite:///{state_dir() / 'mlflow.db'}"


def ensure_experiment(client: Any, name: str) -> str:
    """The experiment's id, creating it with artifacts in the state folder (not ./mlruns)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = (state_dir() / "mlartifacts" / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another process
        return client.get_experiment_by_name(name).experiment_id


def configure_mlflow(tracking_uri: str | None = None, experiment: str = "gpuflows") -> str:
    """Point the fluent ``mlflow`` API at our tracking store and experiment; returns the experiment id."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri or default_tracking_uri())
    exp_id = ensure_experiment(mlflow.MlflowClient(), experiment)
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id


@dataclass
class TaskRecord:
    """One placed task as the runner saw it."""

    name: str
    task_run_id: str
    submitted_at: float
    placement: dict | None = None
    placed_at: float | None = None
    finished_at: float | None = None
    state: str = "PENDING"
    gpu_utilization: float | None = None
    extra: dict = field(default_factory=dict)


class RunTracker:
    """Background MLflow logger for one flow run."""

    def __init__(self, tracking_uri: str | None, experiment: str, run_name: str, tags: dict[str, str] | None = None):
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.experiment = experiment
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.parent_run_id: str | None = None
        self._ready = threading.Event()
        self._queue: queue.Queue = queue.Queue()
        self._records: list[TaskRecord] = []
        self._thread = threading.Thread(target=self._loop, name="gpuflows-mlflow", daemon=True)
        self._thread.start()

    def task_finished(self, record: TaskRecord) -> None:
        self._queue.put(record)

    def wait_parent(self, timeout: float = 60.0) -> str | None:
        """The flow's MLflow run id, once created (for flows that log their own nested runs)."""
        self._ready.wait(timeout)
        return self.parent_run_id

    def _loop(self) -> None:
        from mlflow import MlflowClient

        try:
            client = MlflowClient(self.tracking_uri)
            exp_id = ensure_experiment(client, self.experiment)
            run = client.create_run(exp_id, run_name=self.run_name, tags=self.tags)
            self.parent_run_id = run.info.run_id
        except Exception:
            log.exception("MLflow tracking disabled for this flow run: could not create the run")
            client = None
        finally:
            self._ready.set()
        while True:
            item = self._queue.get()
            if item is None:
                break
            self._records.append(item)
            if client is not None:
                try:
                    self._log_task(client, exp_id, item)
                except Exception:
                    log.exception("could not log task %s to MLflow", item.name)
        if client is not None:
            try:
                self._log_timeline(client)
                client.set_terminated(self.parent_run_id, "FINISHED")
            except Exception:
                log.exception("could not finish the MLflow run")

    def _log_task(self, client: Any, exp_id: str, r: TaskRecord) -> None:
        from mlflow.entities import Metric, Param

        child = client.create_run(exp_id, run_name=r.name, start_time=int(r.submitted_at * 1000),
                                  tags={"mlflow.parentRunId": self.parent_run_id,
                                        "prefect.task_run_id": r.task_run_id, "gpuflows.state": r.state})
        p = r.placement or {}
        params = {"node": p.get("node", ""), "devices": ",".join(str(i) for i in p.get("devices", [])) or "none",
                  "fraction": p.get("fraction", 0.0), "memory_bytes": p.get("memory", 0), "cpus": p.get("cpus", 0.0),
                  "lease_id": p.get("lease_id", ""), **{k: v for k, v in r.extra.items()}}
        now = int(time.time() * 1000)
        metrics = []
        if r.placed_at is not None:
            metrics.append(Metric("wait_time_s", r.placed_at - r.submitted_at, now, 0))
            if r.finished_at is not None:
                metrics.append(Metric("run_time_s", r.finished_at - r.placed_at, now, 0))
        if r.gpu_utilization is not None:
            metrics.append(Metric("gpu_utilization", r.gpu_utilization, now, 0))
        client.log_batch(child.info.run_id, metrics=metrics,
                         params=[Param(k, str(v)) for k, v in params.items()])
        status = "FINISHED" if r.state == "COMPLETED" else ("KILLED" if r.state == "CANCELLED" else "FAILED")
        client.set_terminated(child.info.run_id, status,
                              end_time=int((r.finished_at or time.time()) * 1000))

    def _log_timeline(self, client: Any) -> None:
        rows = [{"task": r.name, "task_run_id": r.task_run_id, "state": r.state,
                 "node": (r.placement or {}).get("node"), "devices": (r.placement or {}).get("devices"),
                 "fraction": (r.placement or {}).get("fraction"), "memory": (r.placement or {}).get("memory"),
                 "submitted_at": r.submitted_at, "placed_at": r.placed_at, "finished_at": r.finished_at}
                for r in self._records]
        if not rows:
            return
        client.log_text(self.parent_run_id, json.dumps(rows, indent=1), "allocations/timeline.json")
        png = timeline_png(rows)
        if png is not None:
            client.log_artifact(self.parent_run_id, str(png), "allocations")
        from mlflow.entities import Metric

        t0 = min(r["submitted_at"] for r in rows)
        busy = [r for r in rows if r["placed_at"] and r["finished_at"]]
        metrics = [Metric("tasks", len(rows), int(time.time() * 1000), 0),
                   Metric("makespan_s", max((r["finished_at"] for r in busy), default=t0) - t0, int(time.time() * 1000), 0)]
        client.log_batch(self.parent_run_id, metrics=metrics)

    def close(self, timeout: float = 120.0) -> None:
        """Flush everything queued and finish the MLflow run."""
        self._queue.put(None)
        self._thread.join(timeout)


def timeline_png(rows: list[dict], path: Path | None = None) -> Path | None:
    """A Gantt chart of placements: one lane per device, one bar per task (fraction as height)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    placed = [r for r in rows if r.get("placed_at") and r.get("finished_at") and r.get("devices")]
    if not placed:
        return None
    t0 = min(r["submitted_at"] for r in rows)
    lanes = sorted({(r["node"], d) for r in placed for d in r["devices"]})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.8 * len(lanes)))
    offsets: dict[tuple, list[tuple[float, float, float]]] = {}
    for r in sorted(placed, key=lambda r: r["placed_at"]):
        for d in r["devices"]:
            lane = lanes.index((r["node"], d))
            # stack overlapping fractional slices within the lane
            busy = [o for o in offsets.get((r["node"], d), []) if o[1] > r["placed_at"] - t0]
            base = sum(o[2] for o in busy)
            ax.barh(lane + base - 0.5 + r["fraction"] / 2, r["finished_at"] - r["placed_at"], left=r["placed_at"] - t0,
                    height=r["fraction"] * 0.95, edgecolor="black", alpha=0.7)
            offsets.setdefault((r["node"], d), []).append((r["placed_at"] - t0, r["finished_at"] - t0, r["fraction"]))
    ax.set_yticks(range(len(lanes)), [f"{n}:gpu{d}" for n, d in lanes])
    ax.set_xlabel("seconds since first submission")
    ax.set_title("GPU slices held by tasks")
    fig.tight_layout()
    path = path or Path(tempfile.mkdtemp(prefix="gpuflows-")) / "timeline.png"
    fig.savefig(path)
    plt.close(fig)
    return path
