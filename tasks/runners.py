"""GPU-aware Prefect task runners: each submitted task gets a placement on a GPU pool first.

``GpuTaskRunner`` (this module) runs tasks locally: in worker processes, one process pool per
set of visible devices so CUDA_VISIBLE_DEVICES takes effect before CUDA starts, or in threads
for CPU-only work. ``GpuRayTaskRunner`` (``tasks.ray_runner``) runs them on a Ray cluster.
Both share ``PlacingTaskRunner``: wait for upstream results, take a lease from the pool
ledger (the pluggable placement policy orders waiting tasks and picks devices), run the task
through Prefect's engine, and release the lease whatever the task's final state.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import os
import threading
import time
import uuid
from concurrent.futures import BrokenExecutor, CancelledError, ThreadPoolExecutor
from typing import Any, Callable, Iterable

from prefect.futures import PrefectConcurrentFuture, PrefectFuture, wait
from prefect.task_runners import TaskRunner
from prefect.utilities.collections import visit_collection

from gpu.devices import nvml_utilization
from gpu.errors import AllocationTimeout
from gpu.ledger import LedgerClient, Placement
from gpu.placement import Request, check_ever_fits
from resource_blocks import GpuPool, MlflowTarget, SchedulerPolicy
from tasks.requests import TaskPlacement, resolve_request
from tasks.tracking import RunTracker, TaskRecord

_ACTIVE_TRACKERS: dict[str, RunTracker] = {}


def flow_mlflow_run_id(timeout: float = 60.0) -> str | None:
    """The MLflow run the GPU task runner opened for the current flow run (None if tracking is off).

    Flows log their own nested runs under it: ``MlflowClient().create_run(..., tags={"mlflow.parentRunId": id})``.
    """
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None)
    if isinstance(runner, PlacingTaskRunner):
        runner._ensure_tracker()
    tracker = _ACTIVE_TRACKERS.get(str(ctx.flow_run.id)) if ctx and ctx.flow_run else None
    return tracker.wait_parent(timeout) if tracker else None


def api_url_env() -> dict[str, str]:
    """PREFECT_API_URL for worker processes when the flow talks to an ephemeral server.

    Without it every worker process would start its own temporary server (slow, and its
    logs and events would be lost).
    """
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return {"PREFECT_API_URL": PREFECT_API_URL.value()}
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    return {"PREFECT_API_URL": server.api_url} if server.running else {}


def _upstream_futures(parameters: dict[str, Any], wait_for: Iterable[PrefectFuture] | None) -> list[PrefectFuture]:
    found: list[PrefectFuture] = list(wait_for or [])

    def visit(expr: Any) -> Any:
        if isinstance(expr, PrefectFuture):
            found.append(expr)
        return expr

    visit_collection(parameters, visit_fn=visit, return_data=False)
    return found


class PlacingTaskRunner(TaskRunner[PrefectConcurrentFuture]):
    """Shared mechanism of the GPU task runners; subclasses only say how a placed task executes."""

    def __init__(self, pool: GpuPool | None = None, policy: SchedulerPolicy | None = None,
                 tracking: MlflowTarget | bool = True, default_request: dict[str, Any] | None = None,
                 max_concurrency: int = 256, allocation_timeout: float | None = None,
                 configure: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        """``configure``: a module-level (picklable) function of the flow run's parameters (defaults filled in)
        returning runner settings (``pool``, ``mode``, ``tracking``, ...: this runner's keyword arguments),
        applied once per flow run on first use (``resolve``): how a flow's decorator, and so a deployment, gets
        its pool and mode from the run's own parameters. The other arguments are the settings until then."""
        super().__init__()
        self.configure = configure
        self._resolved = configure is None
        self._resolve_lock = threading.Lock()
        self.pool = pool or GpuPool()
        self.policy = policy or SchedulerPolicy()
        if isinstance(tracking, bool):
            tracking = MlflowTarget(enabled=tracking)
        self.tracking = tracking
        self.default_request = dict(default_request or {})
        Request(**self.default_request)
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency!r}: must be >= 1")
        self.max_concurrency = max_concurrency
        self.allocation_timeout = allocation_timeout
        self._ledger: LedgerClient | None = None
        self._ledger_lock = threading.Lock()
        self._dispatcher: ThreadPoolExecutor | None = None
        self._tracker: RunTracker | None = None
        self._flow_run_key: str | None = None
        self._cancel_events: dict[uuid.UUID, threading.Event] = {}
        self._utilization_source = None
        self._context_cache: tuple[tuple, dict[str, Any], dict[str, str]] | None = None

    # -- configuration values: equality, duplication, pickling -------------------------------
    def _config(self) -> dict[str, Any]:
        return dict(pool=self.pool, policy=self.policy, tracking=self.tracking, default_request=self.default_request,
                    max_concurrency=self.max_concurrency, allocation_timeout=self.allocation_timeout,
                    configure=None if self._resolved else self.configure)  # a resolved copy keeps the settings

    def duplicate(self):
        return type(self)(**self._config())

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._config() == self._config()

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self._config()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["config"])

    # -- lifecycle ------------------------------------------------------------------------------
    @abc.abstractmethod
    def _open_ledger(self) -> LedgerClient: ...

    def __enter__(self):
        super().__enter__()
        self._dispatcher = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="gpuflows-dispatch")
        return self

    def ledger(self) -> LedgerClient:
        """The pool's ledger this runner places tasks on (opened on first use), for work that leases slices
        itself for longer than a task — the serving runtime's workers — so its leases and the tasks' share one
        account (on Ray: the ledger actor)."""
        return self._ensure_ledger()

    def resolve(self) -> "PlacingTaskRunner":
        """Apply ``configure`` to the current flow run's parameters (once; no-op without ``configure``).

        Runs on first use (submission, ``ledger()``, the MLflow run), so a flow reading ``pool``/``tracking`` from
        its runner before submitting calls this first. Settings this runner type lacks (``mode`` on Ray) are ignored.
        """
        if self._resolved:
            return self
        with self._resolve_lock:
            if self._resolved:
                return self
            import inspect

            from prefect.context import FlowRunContext

            ctx = FlowRunContext.get()
            if ctx is None or ctx.flow is None:
                raise RuntimeError("a task runner with configure= resolves its settings inside a flow run")
            params = {name: p.default for name, p in inspect.signature(ctx.flow.fn).parameters.items()
                      if p.default is not inspect.Parameter.empty}
            params.update(ctx.parameters or {})
            config = self._config()
            settings = {k: v for k, v in dict(self.configure(params)).items() if k in config}
            if settings.get("max_concurrency", self.max_concurrency) != self.max_concurrency:
                raise ValueError("max_concurrency is fixed when the runner starts; set it on the runner itself")
            fresh = type(self)(**{**config, **settings, "configure": None})  # validated as the constructor does
            for key in settings:
                setattr(self, key, getattr(fresh, key))
            self._resolved = True
        return self

    def _ensure_ledger(self) -> LedgerClient:
        """The pool's ledger, opened on the first submission rather than in ``__enter__``.

        Prefect also enters a copy of the flow's task runner in every worker process that runs a
        task (``prefect.context.hydrated_context``), only to rebuild the flow-run context. Opening
        the ledger there, once per task (on Ray: probe tasks on every node, the actor lookup, a
        heartbeat thread), cost seconds per task and spawned extra Ray workers.
        """
        self.resolve()
        with self._ledger_lock:
            if self._ledger is None:
                self._ledger = self._open_ledger()
            return self._ledger

    def _ensure_tracker(self) -> None:
        """Open the flow's MLflow run on first submission, when the flow-run context is known."""
        self.resolve()
        if self._tracker is not None or not self.tracking.enabled:
            return
        from prefect.context import FlowRunContext
        from prefect.settings import PREFECT_SERVER_API_HOST, PREFECT_SERVER_API_PORT, PREFECT_UI_URL

        ctx = FlowRunContext.get()
        run = ctx.flow_run if ctx else None
        tags = {"prefect.flow_run_id": str(run.id)} if run else {}
        if run:  # the link back; without an API URL (ephemeral server) the UI that `prefect server start` serves
            ui = PREFECT_UI_URL.value() or f"http://{PREFECT_SERVER_API_HOST.value()}:{PREFECT_SERVER_API_PORT.value()}"
            tags["prefect.flow_run_url"] = f"{ui.rstrip('/')}/runs/flow-run/{run.id}"
        if ctx and ctx.flow:
            tags["prefect.flow_name"] = ctx.flow.name
        self._tracker = RunTracker(self.tracking.resolved_uri(), self.tracking.experiment,
                                   run.name if run else f"gpuflows-{uuid.uuid4().hex[:6]}", tags)
        if run:
            self._flow_run_key = str(run.id)
            _ACTIVE_TRACKERS[self._flow_run_key] = self._tracker

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            if self._dispatcher is not None:
                self._dispatcher.shutdown(wait=True)
                self._dispatcher = None
            self._shutdown_backend()
        finally:
            if self._tracker is not None:
                self._tracker.close()
                _ACTIVE_TRACKERS.pop(self._flow_run_key or "", None)
                self._tracker = None
            super().__exit__(exc_type, exc_value, traceback)

    def _shutdown_backend(self) -> None:
        """Stop executors of the backend (after every dispatched task has finished)."""

    def cancel_all(self) -> None:
        for event in list(self._cancel_events.values()):
            event.set()

    # -- submission -----------------------------------------------------------------------------
    def submit(self, task, parameters: dict[str, Any], wait_for: Iterable[PrefectFuture] | None = None,
               dependencies: dict[str, set] | None = None) -> PrefectConcurrentFuture:
        if not self._started or self._dispatcher is None:
            raise RuntimeError("Task runner is not started")
        request = resolve_request(task, self.default_request)
        capacity = getattr(self._ensure_ledger(), "capacity", None)
        if capacity is not None:
            check_ever_fits(request, capacity)  # fail at once, in the flow, naming the request
        self._ensure_tracker()
        task_run_id = uuid.uuid4()
        cancel_event = threading.Event()
        self._cancel_events[task_run_id] = cancel_event
        record = TaskRecord(task.name, str(task_run_id), time.time())
        ctx = contextvars.copy_context()
        future = self._dispatcher.submit(ctx.run, self._dispatch, task, task_run_id, parameters, wait_for,
                                         dependencies, request, cancel_event, record)
        return PrefectConcurrentFuture(task_run_id=task_run_id, wrapped_future=future)

    def _dispatch(self, task, task_run_id: uuid.UUID, parameters: dict[str, Any],
                  wait_for: Iterable[PrefectFuture] | None, dependencies: dict[str, set] | None,
                  request: Request, cancel_event: threading.Event, record: TaskRecord):
        """Runs in a dispatcher thread: upstream -> lease -> execute -> release."""
        from prefect.states import Cancelled, Crashed, Failed

        upstream = _upstream_futures(parameters, wait_for)
        if upstream:
            wait(upstream)
        # A task whose upstream failed will not run: don't hold a slice for it.
        upstream_ok = all(f.state.is_completed() for f in upstream)
        placement: Placement | None = None
        try:
            if upstream_ok:
                placement = self._ledger.allocate(request, self.allocation_timeout, cancel_event)
                record.placement = placement.to_dict()
                record.placed_at = time.time()
            state = self._execute(task, task_run_id, parameters, wait_for, dependencies, placement, cancel_event)
        except (InterruptedError, asyncio.CancelledError, CancelledError) as exc:
            state = Cancelled(message=str(exc) or f"task {task.name!r} was cancelled")
        except AllocationTimeout as exc:
            state = Failed(message=str(exc))
        except Exception as exc:  # the backend broke, not the task: report it as a crash
            state = Crashed(message=f"task {task.name!r} could not run: {exc!r}")
        finally:
            record.finished_at = time.time()
            if placement is not None:
                self._measure_gpu(placement, record)
                self._ledger.release(placement.lease_id)
            self._cancel_events.pop(task_run_id, None)
        record.state = state.type.value
        if self._tracker is not None:
            self._tracker.task_finished(record)
        return state

    def _worker_context(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Prefect's serialized context and settings env for running a task in another process.

        Each costs ~20 ms of CPU per call (Prefect's process runner computes them once per runner).
        They are cached while the submitting contexts are the same objects and the tags are equal,
        so a submission under other tags or settings, or from inside a task, still gets its own.
        """
        from prefect.context import EngineContext, SettingsContext, TagsContext, TaskRunContext, serialize_context
        from prefect.settings import get_current_settings

        objects = (EngineContext.get(), TaskRunContext.get(), SettingsContext.get())
        tags = frozenset(TagsContext.get().current_tags)
        cached = self._context_cache
        if cached is None or cached[0][1] != tags or any(a is not b for a, b in zip(cached[0][0], objects)):
            cached = ((objects, tags), serialize_context(),
                      get_current_settings().to_environment_variables(exclude_unset=True))
            self._context_cache = cached
        return cached[1], cached[2]

    def _measure_gpu(self, placement: Placement, record: TaskRecord) -> None:
        """At the end of the task: the share it held (``gpu_share``) and, on real GPUs only, NVML's
        utilisation and memory in use averaged over its devices; nothing measured on a simulated pool."""
        from gpu.devices import nvml_readings

        record.gpu_share = placement.fraction if placement.devices else None
        if placement.simulated or not placement.devices:
            return
        readings = nvml_readings()
        if not readings:
            return
        held = [readings.get(i, (0.0, 0.0)) for i in placement.devices]
        record.gpu_utilization = sum(u for u, _ in held) / len(held)
        record.gpu_memory_mb = sum(m for _, m in held) / len(held)

    @abc.abstractmethod
    def _execute(self, task, task_run_id: uuid.UUID, parameters: dict[str, Any],
                 wait_for: Iterable[PrefectFuture] | None, dependencies: dict[str, set] | None,
                 placement: Placement | None, cancel_event: threading.Event):
        """Run the task through Prefect's engine with ``placement`` and return its final State."""


def _pin_devices(visible: str) -> None:
    """Process-pool initializer: fix the visible GPUs before anything can start CUDA."""
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = visible


class GpuTaskRunner(PlacingTaskRunner):
    """Places each task on a slice of a GPU pool and runs it locally.

    Args:
        pool: the GpuPool block (default: NVML GPUs, else a simulated 2 x 16 GiB pool).
        mode: ``"process"`` (default; CUDA_VISIBLE_DEVICES per task) or ``"thread"`` (CPU-only work,
            lowest overhead; the placement's device string carries the GPU index instead).
        workers_per_device_set: processes kept per set of visible devices.
        policy: SchedulerPolicy block choosing the placement policy (default FIFO + best fit).
        tracking: MlflowTarget block, or False to switch MLflow tracking off.
        default_request: request for tasks that declare none (default: nothing, i.e. CPU only).
    """

    def __init__(self, pool: GpuPool | None = None, mode: str = "process", workers_per_device_set: int = 2, **kwargs):
        if mode not in ("process", "thread"):
            raise ValueError(f"mode={mode!r}: choose 'process' or 'thread'")
        if workers_per_device_set < 1:
            raise ValueError(f"workers_per_device_set={workers_per_device_set!r}: must be >= 1")
        super().__init__(pool, **kwargs)
        self.mode = mode
        self.workers_per_device_set = workers_per_device_set
        self._pools: dict[str, Any] = {}
        self._pools_lock = threading.Lock()

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "mode": self.mode, "workers_per_device_set": self.workers_per_device_set}

    def _open_ledger(self) -> LedgerClient:
        return self.pool.open_ledger(self.policy.placement_policy())

    def _task_placement(self, placement: Placement | None) -> TaskPlacement:
        placement = placement or Placement("", "", (), 0.0, 0)
        if placement.simulated or not placement.devices:
            return TaskPlacement(placement, "cpu", "" if self.mode == "thread" else placement.cuda_visible_devices)
        if self.mode == "thread":
            return TaskPlacement(placement, f"cuda:{placement.devices[0]}", "")
        return TaskPlacement(placement, "cuda:0", placement.cuda_visible_devices)

    def _execute(self, task, task_run_id, parameters, wait_for, dependencies, placement, cancel_event):
        tp = self._task_placement(placement)
        if self.mode == "thread":
            return self._execute_in_thread(task, task_run_id, parameters, wait_for, dependencies, tp, cancel_event)
        return self._execute_in_process(task, task_run_id, parameters, wait_for, dependencies, tp)

    @staticmethod
    def _execute_in_thread(task, task_run_id, parameters, wait_for, dependencies, tp, cancel_event):
        from prefect.task_engine import run_task_async, run_task_sync

        from tasks.requests import placed

        kwargs = dict(task=task, task_run_id=task_run_id, parameters=parameters, wait_for=wait_for,
                      return_type="state", dependencies=dependencies, context=dict(cancel_event=cancel_event))
        with placed(tp):
            if task.isasync:
                return asyncio.run(run_task_async(**kwargs))
            return run_task_sync(**kwargs)

    def _process_pool(self, visible: str):
        """The process pool for one set of visible devices, created on first use."""
        from prefect.task_runners import ProcessPoolTaskRunner

        with self._pools_lock:
            pool = self._pools.get(visible)
            if pool is None:
                pool = ProcessPoolTaskRunner(self.workers_per_device_set, initializer=_pin_devices, initargs=(visible,))
                pool.__enter__()
                self._pools[visible] = pool
            return pool

    def _execute_in_process(self, task, task_run_id, parameters, wait_for, dependencies, tp):
        import cloudpickle
        from prefect.states import Crashed

        from tasks.requests import PLACEMENT_ENV

        pool = self._process_pool(tp.visible_devices)
        context, settings_env = self._worker_context()
        env = settings_env | dict(os.environ) | api_url_env() | {PLACEMENT_ENV: tp.to_env()}
        # Prefect's process runner does the pickling, parameter resolution and log forwarding;
        # we call its per-task step directly so the placement travels in this task's env.
        try:
            future = pool._resolve_futures_and_submit(task=task, task_run_id=task_run_id, parameters=parameters,
                                                      wait_for=wait_for, dependencies=dependencies,
                                                      context=context, env=env)
            return cloudpickle.loads(future.result())
        except BrokenExecutor as exc:
            with self._pools_lock:
                if self._pools.get(tp.visible_devices) is pool:
                    del self._pools[tp.visible_devices]
            state = Crashed(message=f"task {task.name!r} worker process died: {exc!r}")
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                client.set_task_run_state(task_run_id, state, force=True)
            return state

    def cancel_all(self) -> None:
        super().cancel_all()
        with self._pools_lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.cancel_all()

    def _shutdown_backend(self) -> None:
        with self._pools_lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.__exit__(None, None, None)
