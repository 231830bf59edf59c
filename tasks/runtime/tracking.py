"""MLflow tracking for task runners: a flow run is an MLflow run, each placed task a nested run.

Everything is logged from one background thread through ``MlflowClient`` so tracking never
blocks task execution; ``close()`` drains the queue so nothing logged is lost. The allocation
timeline (which task held which slice when) is logged as a table and a Gantt-chart PNG.

Every run we create carries its holder's host, pid space, pid and process start time, so a later
tracker marks the runs of processes that died (``kill -9``, OOM) KILLED instead of leaving them
RUNNING, the way the pool ledger reclaims the leases of dead holders (and, like it, judges by pid only
the holders whose pids it can see: ``gpu.liveness.pids_visible``). A tracker that cannot log records
the error in ``errors`` and logs it at ERROR on the flow run's Prefect logger.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from gpu.liveness import HOST, PID_SPACE, pids_visible, process_alive, process_start
from gpu.state import state_dir
from resource_blocks.mlflow_target import default_tracking_uri
from tasks.runtime.png import pyplot, save_png

log = logging.getLogger("gpuflows.tracking")

HOST_TAG, PID_TAG, PSTART_TAG = "gpuflows.host", "gpuflows.pid", "gpuflows.pstart"
SPACE_TAG = "gpuflows.pid_space"  # gpu.liveness.PID_SPACE of the holder: its pid means nothing elsewhere
_OPENED: set[str] = set()  # tracking URIs whose store this process has opened
_OPEN_LOCK = threading.Lock()
_LINGER_S = 0.2    # how long the writer gathers finished tasks into one batch
_BATCH_MAX = 512   # records per batch at most
_TRACKERS: dict[str, RunTracker] = {}  # by flow run id, for flow_tracker()


def holder_tags() -> dict[str, str]:
    """Tags naming this process as the holder of a run, for :func:`mark_dead_runs_killed`."""
    return dict(_holder_tags(os.getpid()))


@lru_cache
def _holder_tags(pid: int) -> tuple[tuple[str, str], ...]:
    return (HOST_TAG, HOST), (SPACE_TAG, PID_SPACE), (PID_TAG, str(pid)), (PSTART_TAG, str(process_start(pid)))


def _sqlite_file(tracking_uri: str) -> Path | None:
    if not tracking_uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url

    db = make_url(tracking_uri).database
    return Path(db) if db and db != ":memory:" else None


@contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    """``flock`` on ``path``: the kernel drops it when the holder dies, so a killed opener blocks nobody."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def open_client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` on ``tracking_uri`` whose store was initialised once per process, under a file lock.

    A fresh SQLite store is made by running every schema migration; processes doing that at once on one
    file failed each other's migrations and left the database half-upgraded, unusable by every later flow.
    ``<db>.lock`` serialises the first open across processes; MLflow caches the store per URI afterwards.
    """
    from mlflow import MlflowClient

    with _OPEN_LOCK:
        if tracking_uri not in _OPENED:
            db = _sqlite_file(tracking_uri)
            with _file_lock(db and db.with_name(db.name + ".lock")):
                try:
                    MlflowClient(tracking_uri)
                except Exception:
                    if db is None or not _set_aside_if_unused(tracking_uri, db):
                        raise
                    MlflowClient(tracking_uri)
            _OPENED.add(tracking_uri)
    return MlflowClient(tracking_uri)


def _set_aside_if_unused(tracking_uri: str, db: Path) -> bool:
    """Move a SQLite store that cannot be opened and holds no run to ``<db>.broken-<time>``.

    Such a store is a first initialisation that was cut off (killed mid-migration, or broken by the old
    unlocked race): it has nothing of anybody's, and leaving it would keep every later flow from logging.
    A store with runs is never touched; the error is raised instead.
    """
    try:
        with sqlite3.connect(db) as con:
            if con.execute("SELECT 1 FROM runs LIMIT 1").fetchone():
                return False
    except sqlite3.OperationalError:  # no runs table: migrations never got that far
        pass
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = SqlAlchemyStore._engine_map.pop(tracking_uri, None)
    if engine is not None:
        engine.dispose()  # its pooled connections still point at the old file
    aside = db.with_name(f"{db.name}.broken-{int(time.time())}")
    os.replace(db, aside)
    log.warning("MLflow store %s could not be opened and held no run; moved it to %s and created a new one", db, aside)
    return True


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


def register_model_version(client: Any, name: str, model: Any, run_id: str) -> str:
    """A new version of registered model ``name`` from ``model`` (the ``ModelInfo`` that ``log_model`` returned
    in run ``run_id``); returns the version.

    The name is created on its first version only: MLflow's own ``registered_model_name=`` route tries to
    create it on every call and prints "Registered model ... already exists" each time after the first. Only
    the existing-name error is expected; any other reaches the caller.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import ALREADY_EXISTS, RESOURCE_ALREADY_EXISTS, ErrorCode
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code not in (ErrorCode.Name(RESOURCE_ALREADY_EXISTS), ErrorCode.Name(ALREADY_EXISTS)):
            raise
    version = client.create_model_version(name, model.model_uri, run_id=run_id, model_id=model.model_id)
    # the logged model's link to its version, as MLflow's registration writes it (the UI's "Registered versions")
    client.set_logged_model_tags(model.model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
        [{"name": name, "version": version.version}])})
    return str(version.version)


def mark_dead_runs_killed(client: Any) -> list[str]:
    """Mark KILLED the RUNNING runs whose holder, a process on this host, has died; returns their ids.

    Only runs whose holder's pids this process can see (``gpu.liveness.pids_visible``): another host's, or
    another pid namespace's on this host (a container with host networking shares our hostname), or a run
    from before a reboot, names a pid that means nothing here. The start time guards against a reused pid.
    """
    experiments = [e.experiment_id for e in client.search_experiments()]
    query = f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{HOST}'"
    dead, token = [], None
    while experiments:  # collect first: terminating while paging would shift the pages
        page = client.search_runs(experiments, query, max_results=1000, page_token=token)
        dead += [r.info.run_id for r in page if PID_TAG in r.data.tags
                 and pids_visible(r.data.tags[HOST_TAG], r.data.tags.get(SPACE_TAG))
                 and not process_alive(int(r.data.tags[PID_TAG]), int(r.data.tags.get(PSTART_TAG) or 0))]
        token = page.token
        if not token:
            break
    for run_id in dead:
        client.set_terminated(run_id, "KILLED")
    if dead:
        log.warning("marked %d MLflow run(s) of dead processes KILLED: %s", len(dead), ", ".join(dead))
    return dead


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
    gpu_utilization: float | None = None  # measured (NVML) percent over the devices held; None when simulated
    gpu_share: float | None = None  # the fraction of a device the task held
    gpu_memory_mb: float | None = None  # measured (NVML) memory in use over the devices held, MiB
    extra: dict = field(default_factory=dict)


REVIEW_FIELDS = ("stream", "window", "trial", "trial_id", "round", "job", "config", "policy", "epoch")


# Parameters that carry a reviewed field under another name: Ekya's tasks take their stream as ``spec``
# (a ``StreamSpec``, whose ``name`` is the stream's).
FIELD_ALIASES = {"spec": "stream"}
# The fields a nested run's name shows after the task's name, e.g. ``retrain cam1 w1``.
NAME_FIELDS = (("stream", ""), ("window", "w"), ("round", "r"), ("trial_id", ""), ("trial", ""), ("job", ""))


def task_fields(parameters: dict[str, Any]) -> dict[str, str]:
    """What a placed task worked on, from its call's parameters (stream, window, trial, round, job...): the
    runner puts it in ``TaskRecord.extra``, which its nested run carries as tags and params."""
    parameters = {**{field: parameters[alias] for alias, field in FIELD_ALIASES.items()
                     if alias in parameters and field not in parameters}, **parameters}
    out = {}
    for key in REVIEW_FIELDS:
        value = parameters.get(key)
        value = getattr(value, "name", value)  # a config or job object: its name
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            out[key] = str(value)[:250]
    return out


# MLflow's system-metrics names (mlflow.system_metrics.metrics.gpu_monitor), for a measured reading only.
GPU_UTIL_METRIC = "system/gpu_0_utilization_percentage"
GPU_MEMORY_METRIC = "system/gpu_0_memory_usage_megabytes"


def flow_run_name(system: str, *parts: str | None, when: float | None = None) -> str:
    """A run name a reviewer can read in MLflow's run list and Prefect's: system, then what the run chose (policy,
    placement, ...), then when it started, to the second: ``ekya-thief-2026-11-24T16:40:07``.

    Parts that only repeat the system are left out (``nona`` placed by ``nona``: ``nona-early_drop-...``), and a
    first part that already starts with the system's name stands for both (``cilantro-njc-...``)."""
    kept = [str(p) for p in parts if p not in (None, "") and str(p) != system]
    head = [] if kept and kept[0].startswith(f"{system}-") else [system]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() if when is None else when))
    return "-".join([*head, *kept, stamp])


VIEW_ID = "flow-runs"
"""The saved view every system's experiment gets (``ExperimentView``): MLflow's experiment tag
``mlflow.sharedViewState.<id>``, listed under the runs page's **Views** and opened by ``?viewStateShareKey=<id>``."""
_NOTE, _OUR_NOTE = "mlflow.note.content", "gpuflows.note"  # the experiment's description, and the last one we wrote


@dataclass(frozen=True)
class ExperimentView:
    """How a system's experiment reads in the MLflow UI, which by default lists every run (a flow run's ~50 nested
    task runs push the flow runs themselves behind "Load more") with no metric column and names cut at 190 px.

    Written as experiment tags, MLflow's own supported ways (no UI patch, no browser storage): the description
    (``mlflow.note.content``, shown above the runs) says what to compare and links the saved view ``VIEW_ID``
    (MLflow's saved-view envelope under ``mlflow.sharedViewState.<id>``, also under **Views**): flow runs only
    (``tags.mlflow.parentRunId IS NULL``), newest first, ``metrics`` then ``params`` as columns, run names in full.
    """

    compare: str  # which runs to put side by side and what decides between them (markdown)
    metrics: tuple[str, ...]  # the headline metrics, the first columns
    params: tuple[str, ...] = ("policy",)

    def state(self) -> dict[str, Any]:
        """The runs page's state (MLflow's search facets and UI state keys)."""
        columns = [f"metrics.`{m}`" for m in self.metrics] + [f"params.`{p}`" for p in self.params]
        return {"searchFilter": "tags.`mlflow.parentRunId` IS NULL", "orderByKey": "attributes.start_time",
                "orderByAsc": False, "selectedColumns": [*columns, "attributes.`Duration`"],
                "columnOrder": ["attributes.`Run Name`"], "columnWidths": {"attributes.`Run Name`": 340}}

    def description(self, experiment_id: str) -> str:
        link = f"#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_ID}"
        return (f"{self.compare}\n\nOpen **[flow runs, headline first]({link})** (also under **Views**): one row per "
                f"flow run, its nested task runs filtered out, {', '.join(f'`{m}`' for m in self.metrics)} as the "
                "first columns; select two runs and **Compare**.")

def publish_view(client: Any, experiment_id: str, view: ExperimentView) -> None:
    """Write ``view`` on the experiment (once per change); a description the user wrote (not the last one we wrote)
    stays."""
    tags = client.get_experiment(experiment_id).tags
    key, state = f"mlflow.sharedViewState.{VIEW_ID}", json.dumps(view.state())
    try:
        saved = json.loads(tags[key])["state"]
    except (KeyError, ValueError, TypeError):
        saved = None
    if saved != state:
        now = int(time.time() * 1000)
        client.set_experiment_tag(experiment_id, key, json.dumps(
            {"name": "flow runs, headline first", "createdAt": now, "updatedAt": now, "state": state}))
    note = view.description(experiment_id)
    if tags.get(_NOTE) in (None, "", tags.get(_OUR_NOTE)) and tags.get(_NOTE) != note:
        client.set_experiment_tag(experiment_id, _NOTE, note)
        client.set_experiment_tag(experiment_id, _OUR_NOTE, note)


def task_run_name(task: str, fields: dict[str, str]) -> str:
    """A nested run's name that says what the task did, so MLflow's run list tells them apart:
    ``task_run_name("retrain", {"stream": "cam1", "window": "1"}) == "retrain cam1 w1"``."""
    return " ".join([task, *(f"{prefix}{fields[key]}" for key, prefix in NAME_FIELDS if key in fields)])


def _task_run(parent_run_id: str, r: TaskRecord, prefect_ui: str | None = None) -> dict[str, Any]:
    """A placed task as one nested run: name, times, status, tags, params and metrics (written in one go);
    with the Prefect UI's address, the tag ``prefect.task_run_url`` links the task run it records."""
    p = r.placement or {}
    params = {"node": p.get("node", ""), "devices": ",".join(str(i) for i in p.get("devices", [])) or "none",
              "fraction": p.get("fraction", 0.0), "memory_bytes": p.get("memory", 0), "cpus": p.get("cpus", 0.0),
              "lease_id": p.get("lease_id", ""), **{k: v for k, v in r.extra.items()}}
    metrics: dict[str, float] = {}
    if r.placed_at is not None:
        metrics["wait_time_s"] = r.placed_at - r.submitted_at
        if r.finished_at is not None:
            metrics["run_time_s"] = r.finished_at - r.placed_at
    share = r.gpu_share if r.gpu_share is not None else (p.get("fraction") if p.get("devices") else None)
    if share is not None:
        metrics["gpu_share"] = float(share)
    if r.gpu_utilization is not None:
        metrics[GPU_UTIL_METRIC] = r.gpu_utilization
    if r.gpu_memory_mb is not None:
        metrics[GPU_MEMORY_METRIC] = r.gpu_memory_mb
    status = "FINISHED" if r.state == "COMPLETED" else ("KILLED" if r.state == "CANCELLED" else "FAILED")
    return {"name": task_run_name(r.name, r.extra), "start": int(r.submitted_at * 1000),
            "end": int((r.finished_at or time.time()) * 1000),
            "status": status, "params": {k: str(v) for k, v in params.items()},
            "tags": {"mlflow.parentRunId": parent_run_id, **holder_tags(), "prefect.task_run_id": r.task_run_id,
                     "gpuflows.state": r.state, **{k: str(v) for k, v in r.extra.items()},
                     **({"prefect.task_run_url": f"{prefect_ui}/runs/task-run/{r.task_run_id}"} if prefect_ui else {})},
            "metrics": metrics}


class RunTracker:
    """Background MLflow logger for one flow run.

    Made inside a flow run (the runner's first submission), it keeps that run's ``flow_run``: Prefect catches
    a flow's exception before it leaves the task runner, but has set the final state on ``flow_run`` by the
    time the runner exits, and that state gives the MLflow run's status.
    """

    def __init__(self, tracking_uri: str | None, experiment: str, run_name: str, tags: dict[str, str] | None = None):
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.experiment = experiment
        self.run_name = run_name
        self.tags = {**(tags or {}), **holder_tags()}
        self.parent_run_id: str | None = None
        self.experiment_id: str | None = None
        self.errors: list[str] = []
        self._view: ExperimentView | None = None  # the experiment's, once the flow logs its inputs
        self._renamed: str | None = None  # the run's name from the flow's inputs (``run_namer``'s), if it gave one
        self._flow_run = ctx.flow_run if ctx else None
        self._ready = threading.Event()
        self._queue: queue.Queue = queue.Queue()
        self._records: list[TaskRecord] = []
        if self._flow_run is not None:
            _TRACKERS[str(self._flow_run.id)] = self
        self._thread = threading.Thread(target=self._loop, name="gpuflows-mlflow", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return not self.errors

    def task_finished(self, record: TaskRecord) -> None:
        self._queue.put(record)

    def wait_parent(self, timeout: float = 60.0) -> str | None:
        """The flow's MLflow run id, once created (for flows that log their own nested runs)."""
        self._ready.wait(timeout)
        return self.parent_run_id

    def flush(self, timeout: float = 60.0) -> list[str]:
        """Wait until what was queued so far is logged; the errors so far, for the flow's result."""
        done = threading.Event()
        self._queue.put(done)
        if not done.wait(timeout):
            return [*self.errors, f"MLflow logging still behind after {timeout:g} s"]
        return list(self.errors)

    def _error(self, what: str, exc: BaseException) -> None:
        """Record a logging failure and say so at ERROR where the flow run's logs go (its Prefect UI page)."""
        self.errors.append(f"{what}: {exc!r}")
        logger = log
        if self._flow_run is not None:
            from prefect.logging.loggers import flow_run_logger

            logger = flow_run_logger(self._flow_run)
        logger.error("MLflow tracking of %s: %s", self.run_name, what, exc_info=exc)

    def _loop(self) -> None:
        exp_id = None
        try:
            client = open_client(self.tracking_uri)
            exp_id = self.experiment_id = ensure_experiment(client, self.experiment)
            self.parent_run_id = client.create_run(exp_id, run_name=self.run_name, tags=self.tags).info.run_id
        except Exception as exc:
            self._error("could not create the flow's MLflow run: nothing of this flow run is logged", exc)
            client = None
        if client is not None:
            try:  # before the flow gets its run id, so a flow completing a dead run's records races no sweep
                mark_dead_runs_killed(client)
            except Exception:
                log.exception("could not mark the MLflow runs of dead processes KILLED")
        self._ready.set()
        status = None
        while status is None:
            items = [self._queue.get()]
            # Tasks finish one by one: waiting a little (``_LINGER_S``) lets one transaction on a SQL store
            # carry many of them. Each SQLite call hands the GIL back, and with the flow's task threads busy
            # every hand-back can wait out Python's switch interval, so fewer, larger batches cost the flow
            # less. A flush or the final status ends the wait at once.
            deadline = time.monotonic() + _LINGER_S
            while isinstance(items[-1], TaskRecord) and len(items) < _BATCH_MAX:
                try:
                    items.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            batch: list[TaskRecord] = []
            for item in items:
                if isinstance(item, TaskRecord):
                    batch.append(item)
                    continue
                self._write_tasks(client, exp_id, batch)  # in order: a flush waits for what came before it
                batch = []
                if isinstance(item, threading.Event):
                    item.set()
                elif isinstance(item, tuple):  # ("inputs"|"outcome"|"tags", dict) of the flow's own run
                    self._write_flow(client, *item)
                elif isinstance(item, str):  # the flow's final status: the end
                    status = item
            self._write_tasks(client, exp_id, batch)
        if client is not None:
            try:
                self._log_timeline(client)
                self._describe(client)
                client.set_terminated(self.parent_run_id, status)
            except Exception as exc:
                self._error("could not finish the flow's MLflow run", exc)

    # -- the flow's own run: decision inputs and headline outcome ---------------------------------
    def log_flow_inputs(self, params: dict[str, Any], run_name: str | None = None,
                        view: ExperimentView | None = None) -> None:
        """The flow's decision inputs (policy, scenario, pool, window, seed...) as params of its MLflow run,
        a readable run name and how its experiment reads (``view``); written by the tracker's thread, in order
        with the task runs."""
        self._queue.put(("inputs", {"params": dict(params), "run_name": run_name, "view": view}))

    def log_flow_outcome(self, metrics: dict[str, float], tags: dict[str, str] | None = None) -> None:
        """The flow's headline outcome (mean accuracy, makespan, goodput...) as metrics of its MLflow run."""
        self._queue.put(("outcome", {"metrics": dict(metrics), "tags": dict(tags or {})}))

    def _write_flow(self, client: Any, kind: str, data: dict) -> None:
        if client is None or self.parent_run_id is None:
            return
        from mlflow.entities import Metric, Param, RunTag

        try:
            now = int(time.time() * 1000)
            params = [Param(k, str(v)[:6000]) for k, v in (data.get("params") or {}).items() if v is not None]
            metrics = [Metric(k, float(v), now, 0) for k, v in (data.get("metrics") or {}).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]
            tags = [RunTag(k, str(v)) for k, v in (data.get("tags") or {}).items()]
            if data.get("run_name"):
                tags.append(RunTag("mlflow.runName", data["run_name"]))
            if data.get("run_name"):
                self._renamed = data["run_name"]
            if data.get("view") is not None:
                self._view = data["view"]
            client.log_batch(self.parent_run_id, metrics=metrics, params=params, tags=tags)
            if data.get("view") is not None and self.experiment_id is not None:
                publish_view(client, self.experiment_id, data["view"])
        except Exception as exc:
            self._error(f"could not log the flow's {kind}", exc)

    def _describe(self, client: Any) -> None:
        """Write ``run_description`` on the flow's run, unless someone wrote one; a failure costs the description
        only (logged), not the run's end."""
        try:
            if _NOTE not in client.get_run(self.parent_run_id).data.tags:
                folders = {a.path for a in client.list_artifacts(self.parent_run_id) if a.is_dir}
                client.set_tag(self.parent_run_id, _NOTE, self.run_description(folders))
        except Exception as exc:
            self._error("could not write the flow's run description", exc)

    def run_description(self, folders: set[str]) -> str:
        """The run page's **Description** (``mlflow.note.content``), which MLflow leaves empty: where the evidence
        of this run is (its Prefect flow run, the artifact ``folders`` it has) and the runs to compare it with."""
        flow_url, name = self.tags.get("prefect.flow_run_url"), self._renamed or self.run_name
        lines = [f"Flow run **[{name}]({flow_url})** in Prefect: its tasks, its logs (the outcome's line) "
                 "and its artifacts." if flow_url else f"Flow run **{name}**."]
        known = {"charts": "`charts/` (the charts)", "tables": "`tables/` (the Prefect tables as JSON)",
                 "allocations": "`allocations/` (each task's slice over time)"}
        shown = [text for folder, text in known.items() if folder in folders]
        if shown:
            lines.append(f"Evidence under **Artifacts**: {', '.join(shown)}; each nested run is one task, window, "
                         "round or policy.")
        view = self._view
        if view is not None:
            lines.append(f"Compare: [flow runs, headline first](#/experiments/{self.experiment_id}/runs?"
                         f"viewStateShareKey={VIEW_ID}&workflowType=machine_learning) "
                         f"({', '.join(f'`{m}`' for m in view.metrics)} first).")
        return "\n\n".join(lines)

    # -- nested task runs, batched -----------------------------------------------------------------
    def _write_tasks(self, client: Any, exp_id: str | None, records: list[TaskRecord]) -> None:
        if not records:
            return
        self._records.extend(records)
        if client is None:
            return
        flow_url = self.tags.get("prefect.flow_run_url", "")
        ui = flow_url.split("/runs/flow-run/")[0] if "/runs/flow-run/" in flow_url else None
        runs = [_task_run(self.parent_run_id, r, ui) for r in records]
        try:
            if _bulk_insert(client, exp_id, runs):
                return
        except Exception:
            log.debug("bulk insert of %d task runs failed; logging them one by one", len(runs), exc_info=True)
        for r, run in zip(records, runs):
            try:
                _log_run(client, exp_id, run)
            except Exception as exc:
                self._error(f"could not log task {r.name}", exc)

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
        # wall-clock seconds from the first task's submission to the last one's end: how long this machine took,
        # not a system's makespan (Ekya's windows are slice time; FLUID logs its own makespan_s)
        now = int(time.time() * 1000)
        metrics = [Metric("tasks", len(rows), now, 0),
                   Metric("tasks_wall_clock_s", max((r["finished_at"] for r in busy), default=t0) - t0, now, 0)]
        client.log_batch(self.parent_run_id, metrics=metrics)

    def close(self, timeout: float = 120.0) -> None:
        """Log everything queued and end the MLflow run as the flow run ended."""
        self._queue.put(self._final_status())
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._error(f"logging did not finish within {timeout:g} s", TimeoutError(self.tracking_uri))
        if self._flow_run is not None:
            _TRACKERS.pop(str(self._flow_run.id), None)

    def _final_status(self) -> str:
        """FINISHED if the flow completed, FAILED if it failed (or awaits a retry), else KILLED: a flow still
        running when its task runner exits was interrupted (crash, cancellation, a signal)."""
        state = getattr(self._flow_run, "state", None)
        if state is None or state.is_completed():
            return "FINISHED"
        return "FAILED" if state.is_failed() or state.name == "AwaitingRetry" else "KILLED"


def _log_run(client: Any, exp_id: str, run: dict[str, Any]) -> None:
    """One nested run through the client (any store): create (tags), one batch (params, metrics), terminate."""
    from mlflow.entities import Metric, Param

    child = client.create_run(exp_id, run_name=run["name"], start_time=run["start"], tags=run["tags"])
    client.log_batch(child.info.run_id, metrics=[Metric(k, v, run["end"], 0) for k, v in run["metrics"].items()],
                     params=[Param(k, v) for k, v in run["params"].items()])
    client.set_terminated(child.info.run_id, run["status"], end_time=run["end"])


def _bulk_insert(client: Any, exp_id: str, runs: list[dict[str, Any]]) -> bool:
    """Write finished nested runs in ONE transaction on a SQL store (False: not a SQL store, use the client).

    Through the client each run costs three commits (create, log_batch, set_terminated), each a SQLite
    write lock and fsync plus ORM work on the writer thread; this is the rows those calls would write.
    """
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    if not isinstance(store, SqlAlchemyStore):
        return False
    import uuid

    from mlflow.entities import LifecycleStage, SourceType
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric, SqlParam, SqlRun, SqlTag
    from mlflow.utils.uri import append_to_uri_path

    location = _experiment_location(store, exp_id)
    with store.ManagedSessionMaker() as session:
        for run in runs:
            run_id = uuid.uuid4().hex
            row = SqlRun(name=run["name"], artifact_uri=append_to_uri_path(location, run_id, "artifacts"),
                         run_uuid=run_id, experiment_id=int(exp_id), source_type=SourceType.to_string(SourceType.UNKNOWN),
                         source_name="", entry_point_name="", user_id=run["tags"].get("mlflow.user", "unknown"),
                         status=run["status"],
                         start_time=run["start"], end_time=run["end"], deleted_time=None, source_version="",
                         lifecycle_stage=LifecycleStage.ACTIVE)
            row.tags = [SqlTag(key=k, value=v) for k, v in {**run["tags"], "mlflow.runName": run["name"]}.items()]
            row.params = [SqlParam(key=k, value=v) for k, v in run["params"].items()]
            row.metrics = [SqlMetric(key=k, value=v, timestamp=run["end"], step=0, is_nan=False)
                           for k, v in run["metrics"].items()]
            row.latest_metrics = [SqlLatestMetric(key=k, value=v, timestamp=run["end"], step=0, is_nan=False)
                                  for k, v in run["metrics"].items()]
            session.add(row)
    return True


def _experiment_location(store: Any, exp_id: str) -> str:
    cache = store.__dict__.setdefault("_gpuflows_locations", {})
    if exp_id not in cache:
        cache[exp_id] = store.get_experiment(exp_id).artifact_location
    return cache[exp_id]


def flow_tracker() -> RunTracker | None:
    """The tracker of the current flow run (the GPU task runner opens it on first submission), or None."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return _TRACKERS.get(str(ctx.flow_run.id)) if ctx and ctx.flow_run else None


def timeline_png(rows: list[dict], path: Path | None = None) -> Path | None:
    """A Gantt chart of placements: one lane per device, one bar per task (fraction as height)."""
    try:
        plt = pyplot()
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
    return save_png(fig, path, "timeline.png")
