"""GPU-aware Prefect task runners: each submitted task gets a placement on a GPU pool first.

``GpuTaskRunner`` (this module) runs tasks locally: in worker processes, one process pool per
set of visible devices so CUDA_VISIBLE_DEVICES takes effect before CUDA starts, or in threads
for CPU-only work. ``GpuRayTaskRunner`` (``tasks.runtime.ray_runner``) runs them on a Ray cluster.
Both share ``PlacingTaskRunner``: wait for upstream results, take a lease from the pool
ledger (the pluggable placement policy orders waiting tasks and picks devices), run the task
through Prefect's engine, and release the lease whatever the task's final state.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import functools
import os
import signal
import threading
import time
import uuid
from concurrent.futures import BrokenExecutor, CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from types import EllipsisType
from typing import Any, Callable, Iterable

from prefect.futures import PrefectConcurrentFuture, PrefectFuture, wait
from prefect.task_runners import TaskRunner
from prefect.utilities.collections import visit_collection

from gpu.devices import nvml_readings
from gpu.errors import AllocationTimeout, ConfigError, NeverFitsError
from gpu.ledger import LedgerClient, Lease, register_worker
from gpu.placement import ResourceRequest, check_ever_fits
from resource_blocks import GpuPool, MlflowTarget, SchedulerPolicy
from tasks.runtime.admission import Admission, AdmissionHost, Admitter
from tasks.runtime.requests import PLACEMENT_ENV, TaskPlacement, placed, resolve_requests
from tasks.runtime.tracking import RunTracker, TaskRecord, flow_tracker, task_fields

_CANCEL_GRACE = 2.0       # seconds __exit__ gives cancelled tasks to stop and release their leases
_WATCHDOG_INTERVAL = 0.1  # seconds between a process worker's checks that its flow process lives
MODES = ("process", "thread")  # GpuTaskRunner's ways to run a placed task
PREFERENCE_TIMEOUT_S = 5.0  # a preference's wait when the runner has no allocation timeout (Fig. 4.4a's timeout)


def flow_mlflow_run_id(timeout: float = 60.0) -> str | None:
    """The MLflow run the GPU task runner opened for the current flow run (None if tracking is off).

    Flows log their own nested runs under it: ``MlflowClient().create_run(..., tags={"mlflow.parentRunId": id})``.
    """
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None)
    if isinstance(runner, PlacingTaskRunner):
        runner._ensure_tracker()
    tracker = flow_tracker()
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


def _ever_fits(request: ResourceRequest, capacity) -> bool:
    try:
        check_ever_fits(request, capacity)
        return True
    except NeverFitsError:
        return False


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
        ResourceRequest(**self.default_request)
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency!r}: must be >= 1")
        self.max_concurrency = max_concurrency
        self.allocation_timeout = allocation_timeout
        self._ledger: LedgerClient | None = None
        self._ledger_lock = threading.Lock()
        self._dispatcher: ThreadPoolExecutor | None = None
        self._tracker: RunTracker | None = None
        self._cancel_events: dict[uuid.UUID, threading.Event] = {}
        self._dispatched: dict[uuid.UUID, Future] = {}
        self._held: dict[str, uuid.UUID] = {}        # lease id -> task run holding it
        self._lost: dict[str, str] = {}              # lease id -> why the ledger took it away
        self._leases_lock = threading.Lock()
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
        self._tracker = RunTracker(self.tracking.resolved_uri(), self.tracking.resolved_experiment(),
                                   run.name if run else f"gpuflows-{uuid.uuid4().hex[:6]}", tags)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """Wait for every dispatched task on a normal exit (or a flow that raised an error).

        On cancellation, SIGTERM or Ctrl-C (a BaseException that is not an Exception: Prefect's
        TerminationSignal, KeyboardInterrupt, asyncio's CancelledError) the tasks are cancelled
        instead, and their dispatchers get ``_CANCEL_GRACE`` seconds to release their leases and
        record Cancelled. Only thread-mode tasks already running can outlast it (a thread cannot be
        stopped): they are counted in a warning and keep their lease until they return or this process
        dies, when the ledger reclaims it.
        """
        still_running: set = set()
        try:
            if self._dispatcher is not None:
                if exc_type is not None and not issubclass(exc_type, Exception):
                    self.cancel_all()
                    _, still_running = wait_futures(list(self._dispatched.values()), timeout=_CANCEL_GRACE)
                    if still_running:
                        self.logger.warning("%d cancelled task(s) still running in threads after %gs; their "
                                            "leases are released when they return", len(still_running), _CANCEL_GRACE)
                    self._dispatcher.shutdown(wait=False)
                else:
                    self._dispatcher.shutdown(wait=True)
                self._dispatcher = None
            self._shutdown_backend()
            if not still_running:  # else their dispatchers still release through it
                self._close_ledger()
        finally:
            if self._tracker is not None:
                self._tracker.close()
                self._tracker = None
            super().__exit__(exc_type, exc_value, traceback)

    def _shutdown_backend(self) -> None:
        """Stop executors of the backend (after every dispatched task has finished)."""

    def _close_ledger(self) -> None:
        """Stop the ledger client's threads and drop its file lock; its leases are all released by now."""
        with self._ledger_lock:
            ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.close()

    def cancel_all(self) -> None:
        """Cancel every task of this runner: waiting ones stop waiting for a lease, ones not started
        never start (``_dispatch`` checks the event before each step), running ones are stopped where
        the backend can (process workers are killed) and end Cancelled."""
        for event in list(self._cancel_events.values()):
            event.set()

    def _lease_lost(self, lease_id: str, reason: str) -> bool:
        """The ledger took ``lease_id`` away (its heartbeat found it reclaimed or expired): the task
        holding it ends Failed with ``reason`` and its cancel event is set. Safe from any thread (the
        ledger's heartbeat calls it); False if no task of this runner holds the lease. (A loss reported
        in the moment between the grant and the dispatcher noting it is still caught: the task's
        ``release()`` then returns False.)"""
        with self._leases_lock:
            task_run_id = self._held.get(lease_id)
            if task_run_id is None:
                return False
            self._lost[lease_id] = reason
            event = self._cancel_events.get(task_run_id)
        if event is not None:
            event.set()
        return True

    # -- submission -----------------------------------------------------------------------------
    def submit(self, task, parameters: dict[str, Any], wait_for: Iterable[PrefectFuture] | None = None,
               dependencies: dict[str, set] | None = None) -> PrefectConcurrentFuture:
        if not self._started or self._dispatcher is None:
            raise RuntimeError("Task runner is not started")
        requests = resolve_requests(task, self.default_request)
        capacity = getattr(self._ensure_ledger(), "capacity", None)
        if capacity is not None:  # fail at once, in the flow, naming the request (a preference list: all of them)
            fits = [r for r in requests if _ever_fits(r, capacity)]
            if not fits:
                check_ever_fits(requests[0], capacity)
            requests = tuple(fits)
        self._ensure_tracker()
        task_run_id = uuid.uuid4()
        cancel_event = threading.Event()
        self._cancel_events[task_run_id] = cancel_event
        record = TaskRecord(task.name, str(task_run_id), time.time(), extra=task_fields(parameters))
        ctx = contextvars.copy_context()
        future = self._dispatcher.submit(ctx.run, self._dispatch, task, task_run_id, parameters, wait_for,
                                         dependencies, requests, cancel_event, record)
        self._dispatched[task_run_id] = future
        future.add_done_callback(lambda _: self._dispatched.pop(task_run_id, None))
        return PrefectConcurrentFuture(task_run_id=task_run_id, wrapped_future=future)

    def _dispatch(self, task, task_run_id: uuid.UUID, parameters: dict[str, Any],
                  wait_for: Iterable[PrefectFuture] | None, dependencies: dict[str, set] | None,
                  requests: tuple[ResourceRequest, ...], cancel_event: threading.Event, record: TaskRecord):
        """Runs in a dispatcher thread: upstream -> lease -> execute -> release -> settle the final state."""
        from prefect.states import Cancelled, Crashed, Failed

        upstream = _upstream_futures(parameters, wait_for)
        if upstream:
            wait(upstream)
        # A task whose upstream failed will not run: don't hold a slice for it.
        upstream_ok = all(f.state.is_completed() for f in upstream)
        placement: Lease | None = None
        lost: str | None = None
        try:
            if cancel_event.is_set():
                raise InterruptedError(f"task {task.name!r} was cancelled before it started")
            if upstream_ok:
                placement = self._acquire_preferred(task, task_run_id, requests, cancel_event)
                record.placement = placement.to_dict()
                record.placed_at = time.time()
                if cancel_event.is_set():
                    raise InterruptedError(f"task {task.name!r} was cancelled before it started")
            state = self._execute(task, task_run_id, parameters, wait_for, dependencies, placement, cancel_event)
        except (InterruptedError, asyncio.CancelledError, CancelledError) as exc:
            state = Cancelled(message=str(exc) or f"task {task.name!r} was cancelled")
        except AllocationTimeout as exc:
            state = Failed(message=str(exc))
        except BaseException as exc:  # noqa: BLE001 - the backend broke, or a worker was told to exit
            # (its SystemExit or TerminationSignal comes back as the call's result): a crash, not the task's failure
            state = Crashed(message=f"task {task.name!r} could not run: {exc!r}")
        finally:
            record.finished_at = time.time()
            if placement is not None:
                self._measure_gpu(placement, record)
                lost = self._release(placement, task.name)
            self._cancel_events.pop(task_run_id, None)
        state = self._settle(task, task_run_id, state, cancel_event, lost)
        record.state = state.type.value
        if self._tracker is not None:
            self._tracker.task_finished(record)
        return state

    def _acquire_preferred(self, task, task_run_id: uuid.UUID, requests: tuple[ResourceRequest, ...],
                           cancel_event: threading.Event) -> Lease:
        """The first of ``requests`` (most preferred first) the ledger grants, each tried for its share of the
        allocation timeout (ESCHER's soft constraints, Fig. 4.4a: no grant in time → cancel, next one).

        Without an allocation timeout each but the last waits ``PREFERENCE_TIMEOUT_S`` and the last waits
        as long as it takes. A try that gives up is withdrawn by the ledger (a grant that raced it is
        released), so no lease of an abandoned preference outlives it.
        """
        if len(requests) == 1:
            return self._acquire(task, task_run_id, requests[0], cancel_event)
        total = self.allocation_timeout
        shares = [PREFERENCE_TIMEOUT_S] * (len(requests) - 1) + [None] if total is None else \
            [total / len(requests)] * len(requests)
        for request, share in zip(requests[:-1], shares):
            try:
                return self._acquire(task, task_run_id, request, cancel_event, timeout=share)
            except (AllocationTimeout, NeverFitsError):
                continue
        try:
            return self._acquire(task, task_run_id, requests[-1], cancel_event, timeout=shares[-1])
        except AllocationTimeout as exc:
            raise AllocationTimeout(f"task {task.name!r} got none of its {len(requests)} preferred requests "
                                    f"within {total}s: {exc}") from exc

    def _acquire(self, task, task_run_id: uuid.UUID, request: ResourceRequest, cancel_event: threading.Event,
                 timeout: float | None | EllipsisType = ...) -> Lease:
        """Take the task's own lease from the pool ledger, waiting for room (``timeout``, by default the
        runner's ``allocation_timeout``).

        The seam for runners whose tasks share a lease that something else holds for longer than a task
        (``GpuTaskRunner``'s admission, ``tasks.runtime.admission``): they override this and ``_release``
        together (an override without ``timeout`` serves tasks without a preference list). Raises what
        ``LedgerClient.allocate`` raises.
        """
        timeout = self.allocation_timeout if timeout is ... else timeout
        placement = self._ledger.allocate(request, timeout, cancel_event)
        with self._leases_lock:
            self._held[placement.lease_id] = task_run_id
        # the ledger's heartbeat reports a lease taken away while the task runs (fencing)
        self._ledger.watch(placement.lease_id, functools.partial(self._lease_lost, placement.lease_id))
        return placement

    def _release(self, placement: Lease, task_name: str) -> str | None:
        """Give the task's slice back; return why the task must fail if its lease was taken away while it ran.

        A lease that is gone (``release()`` is False) or that the ledger reported lost was reclaimed:
        the slice may have been granted to another task meanwhile. A release that raises (SQLite
        locked or disk full, the Ray ledger actor unreachable) is retried with back-off for up to the
        lease TTL, while the heartbeat keeps the lease alive; if it still fails it is logged loudly and
        given up (the ledger reclaims the lease when this process dies). Never raises: a release
        problem must not replace the task's own final state.
        """
        lease_id = placement.lease_id
        deadline = time.monotonic() + self.pool.lease_ttl_s
        delay = 0.05
        released: bool | None = None  # None: the ledger could not be told
        while released is None:
            try:
                released = self._ledger.release(lease_id)
            except Exception as exc:  # noqa: BLE001 - whatever the ledger raises, the task's state stands
                if time.monotonic() + delay > deadline:
                    self.logger.error("could not release lease %s of task %r for %gs, giving up: %r; the pool "
                                      "ledger reclaims it when this process exits", lease_id, task_name,
                                      self.pool.lease_ttl_s, exc)
                    break
                self.logger.warning("release of lease %s of task %r failed, retrying in %.2fs: %r",
                                    lease_id, task_name, delay, exc)
                time.sleep(delay)
                delay = min(2 * delay, 1.0)
        with self._leases_lock:
            self._held.pop(lease_id, None)
            lost = self._lost.pop(lease_id, None)
        if lost is None and released is False:
            lost = "the pool ledger reclaimed it (lease expired or holder presumed dead)"
        if lost is None:
            return None
        return (f"lease {lease_id} of task {task_name!r} ({placement.describe()}) was reclaimed while the task "
                f"ran: {lost}. Its slice may have been granted to another task, so its result cannot be trusted "
                f"to have had the GPU alone")

    def _settle(self, task, task_run_id: uuid.UUID, state, cancel_event: threading.Event, lost: str | None):
        """The task's final state once its lease is settled, recorded in Prefect where the engine could not.

        A reclaimed lease fails the task (a task that failed or crashed by itself keeps its own state,
        with the note added). A crash is the backend's (a worker died, or was told to exit), so the
        engine could not record it; if the task had been cancelled, that is what killed it: Cancelled.
        """
        from prefect.states import Cancelled, Failed

        if lost is not None:
            self.logger.error("task %r: %s", task.name, lost)
            if state.is_failed() or state.is_crashed():
                return state.model_copy(update={"message": f"{state.message} (also: {lost})"})
            state = Failed(message=lost)
        elif not state.is_crashed():
            return state
        elif cancel_event.is_set():
            state = Cancelled(message=f"task {task.name!r} was cancelled while it ran; its worker was stopped")
        self._report_state(task, task_run_id, state)
        return state

    def _report_state(self, task, task_run_id: uuid.UUID, state) -> None:
        """Record in Prefect a final state the task's engine could not (its worker is gone, or the runner
        decided it). Prefect builds task runs from their engines' events, which may not have reached the
        server yet: the run is then created with this state (later events, being older, do not replace it),
        unless they reach it first."""
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext
        from prefect.exceptions import PrefectHTTPStatusError

        flow_run = getattr(FlowRunContext.get(), "flow_run", None)
        try:
            with get_client(sync_client=True) as client:
                try:
                    client.set_task_run_state(task_run_id, state, force=True)
                    return
                except PrefectHTTPStatusError as exc:
                    if exc.response.status_code != 404 or flow_run is None:
                        raise
                try:  # not recorded yet
                    client.create_task_run(task, flow_run.id, str(task_run_id), id=task_run_id, name=task.name,
                                           state=state)
                except PrefectHTTPStatusError as exc:
                    if exc.response.status_code != 409:
                        raise
                    client.set_task_run_state(task_run_id, state, force=True)  # recorded meanwhile
        except Exception as exc:  # noqa: BLE001 - the runner's own bookkeeping must not fail the flow
            self.logger.warning("could not record state %s of task run %s: %r", state.type.value, task_run_id, exc)

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

    def _measure_gpu(self, placement: Lease, record: TaskRecord) -> None:
        """At the end of the task: the share it held (``gpu_share``) and, on real GPUs only, NVML's
        utilisation and memory in use averaged over its devices; nothing measured on a simulated pool."""
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
                 placement: Lease | None, cancel_event: threading.Event):
        """Run the task through Prefect's engine with ``placement`` and return its final State."""


def _init_worker(visible: str, parent_pid: int, ledger_path: str, owner_key: str) -> None:
    """Process-pool initializer: pin the visible GPUs before anything can start CUDA, and make this
    worker die with the flow process ``parent_pid`` that holds the leases of the tasks it runs.

    A watchdog thread polls ``os.getppid()``: when the flow process dies, however (``kill -9``
    included), the worker is re-parented, and it kills its own descendants and itself. We do not use
    ``prctl(PR_SET_PDEATHSIG)``: Linux sends that signal when the *thread* that spawned the child
    exits, not the process, and ProcessPoolExecutor spawns workers from whichever thread submits (our
    dispatcher threads) or from its manager thread, so it would kill healthy workers whenever such a
    thread ended. The watchdog's limit is a task holding the GIL in C code, which delays it; that is
    why the ledger must also know the worker (below) before it re-grants a dead flow's slices.

    SIGTERM and SIGINT are swallowed (by a handler, not SIG_IGN, so that programs a task starts do
    not inherit it): they come to the whole process group when ``serve()``, a Prefect worker or Ctrl-C
    stops the flow run, and the flow process must handle them first, so that it cancels these tasks
    (and kills this worker) and records them Cancelled, not each worker dying on its own as a crash.

    The worker registers with the pool ledger (``ledger_path``, a shared pool's file) under the flow
    process's ``owner_key``: the ledger then keeps the flow's slices until this worker has died too,
    so even a worker the watchdog is slow to stop never shares a GPU with the slices' next holder.
    """
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    if ledger_path != ":memory:":
        register_worker(ledger_path, owner_key)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="gpuflows-parent-watchdog", daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    """Kill this process and its descendants once ``parent_pid`` is no longer its parent (also at once,
    if the flow process died while this worker was starting)."""
    while os.getppid() == parent_pid:
        time.sleep(_WATCHDOG_INTERVAL)
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """Pids of every process below ``pid`` (children first), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class GpuTaskRunner(PlacingTaskRunner):
    """Places each task on a slice of a GPU pool and runs it locally.

    Args:
        pool: the GpuPool block (default: NVML GPUs, else a simulated 2 x 16 GiB pool).
        mode: ``"process"`` (default; CUDA_VISIBLE_DEVICES per task) or ``"thread"`` (CPU-only work, lowest
            overhead; the placement's device string carries the GPU index instead).
        workers_per_device_set: processes kept per set of visible devices (process mode).
        admission: how a system admits tasks into what it holds for longer than a task, instead of each task
            leasing its own slice (``tasks.runtime.admission``; e.g. ``tasks.salus.admission.SalusColocation``:
            tasks admitted into memory lanes of a device one executor leases whole). None: every task takes its
            own ledger lease. A task the admission does not place takes its plain lease as usual.
        policy: SchedulerPolicy block choosing the placement policy (default FIFO + best fit).
        tracking: MlflowTarget block, or False to switch MLflow tracking off.
        default_request: request for tasks that declare none (default: nothing, i.e. CPU only).
    """

    def __init__(self, pool: GpuPool | None = None, mode: str = "process", workers_per_device_set: int = 2,
                 admission: Admission | None = None, **kwargs):
        if mode not in MODES:
            raise ConfigError("mode", mode, f"choose one of {MODES}")
        if isinstance(workers_per_device_set, bool) or not isinstance(workers_per_device_set, int) \
                or workers_per_device_set < 1:
            raise ConfigError("workers_per_device_set", workers_per_device_set, "must be a whole number >= 1")
        if admission is not None and not isinstance(admission, Admission):
            raise ConfigError("admission", admission, "must be an Admission (tasks.runtime.admission), or None")
        super().__init__(pool, **kwargs)
        self.mode = mode
        self.workers_per_device_set = workers_per_device_set
        self.admission = admission
        self._admitter: Admitter | None = None
        self._admitter_lock = threading.Lock()
        self._holder_gone: set[uuid.UUID] = set()  # task runs whose admission lost what held their placement
        self._pools: dict[str, Any] = {}
        self._broken_pools: list[Any] = []
        self._pools_lock = threading.Lock()

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "mode": self.mode, "workers_per_device_set": self.workers_per_device_set,
                "admission": self.admission}

    def _open_ledger(self) -> LedgerClient:
        return self.pool.open_ledger(self.policy.placement_policy())

    @property
    def _in_threads(self) -> bool:
        return self.mode == "thread"

    # -- the admission seam: _acquire/_release/_settle/_task_placement ask the admission, if any -------------
    def admitter(self) -> Admitter | None:
        """The admission's live state for this runner (None without an admission), opened from the resolved
        settings on first use: what a system's helper reads (``tasks.salus.admission.salus_executor``)."""
        self.resolve()
        if self.admission is None:
            return None
        with self._admitter_lock:
            if self._admitter is None:
                self._admitter = self.admission.open(
                    AdmissionHost(self._ensure_ledger, self.allocation_timeout, self._lease_lost))
            return self._admitter

    def submit(self, task, parameters: dict[str, Any], wait_for: Iterable[PrefectFuture] | None = None,
               dependencies: dict[str, set] | None = None) -> PrefectConcurrentFuture:
        """Under an admission, also check the task against it first (one error in the flow, before any work)."""
        admitter = self.admitter() if self._started else None
        if admitter is not None:
            admitter.check(task, resolve_requests(task, self.default_request)[0])
        return super().submit(task, parameters, wait_for, dependencies)

    def _acquire(self, task, task_run_id: uuid.UUID, request: ResourceRequest, cancel_event: threading.Event,
                 timeout: float | None | EllipsisType = ...) -> Lease:
        """Under an admission: a task it places waits to be admitted; any other task takes its plain ledger
        lease (``Admitter.ledger_request``)."""
        admitter = self.admitter()
        plain = request if admitter is None else admitter.ledger_request(task, request)
        if plain is not None:
            return super()._acquire(task, task_run_id, plain, cancel_event, timeout)
        placement = admitter.acquire(task, request, cancel_event)
        with self._leases_lock:
            self._held[placement.lease_id] = task_run_id
        return placement

    def _release(self, placement: Lease, task_name: str) -> str | None:
        admitter = self.admitter()
        if admitter is None or not admitter.holds(placement):
            return super()._release(placement, task_name)
        lost = admitter.release(placement)
        with self._leases_lock:
            task_run_id = self._held.pop(placement.lease_id, None)
            lost = self._lost.pop(placement.lease_id, None) or lost
            if lost is not None and task_run_id is not None:
                self._holder_gone.add(task_run_id)
        return None if lost is None else f"task {task_name!r}: {lost}"

    def _settle(self, task, task_run_id: uuid.UUID, state, cancel_event: threading.Event, lost: str | None):
        """A task whose admission lost what held its placement (a Salus executor its device's lease) ends
        Crashed: the infrastructure under it went away, whatever the task itself made of it."""
        with self._leases_lock:
            holder_gone = task_run_id in self._holder_gone
            self._holder_gone.discard(task_run_id)
        if not holder_gone:
            return super()._settle(task, task_run_id, state, cancel_event, lost)
        from prefect.states import Crashed

        self.logger.error("task %r: %s", task.name, lost)
        state = Crashed(message=f"{lost} (the task: {state.message})")
        self._report_state(task, task_run_id, state)
        return state

    def _task_placement(self, placement: Lease | None) -> TaskPlacement:
        admitter = self._admitter
        payload = admitter.payload(placement) if admitter is not None and placement is not None else None
        placement = placement or Lease("", "", (), 0.0, 0)
        if placement.simulated or not placement.devices:
            device, visible = "cpu", "" if self._in_threads else placement.cuda_visible_devices
        elif self._in_threads:
            device, visible = f"cuda:{placement.devices[0]}", ""
        else:
            device, visible = "cuda:0", placement.cuda_visible_devices
        return TaskPlacement(placement, device, visible, None if payload is None else dict(payload))

    def _execute(self, task, task_run_id, parameters, wait_for, dependencies, placement, cancel_event):
        tp = self._task_placement(placement)
        if self._in_threads:
            return self._execute_in_thread(task, task_run_id, parameters, wait_for, dependencies, tp, cancel_event)
        return self._execute_in_process(task, task_run_id, parameters, wait_for, dependencies, tp)

    @staticmethod
    def _execute_in_thread(task, task_run_id, parameters, wait_for, dependencies, tp, cancel_event):
        from prefect.task_engine import run_task_async, run_task_sync

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
                ledger = self._ensure_ledger()
                workers = self.workers_per_device_set if self.admission is None else \
                    self.admission.worker_processes(self.workers_per_device_set)
                pool = ProcessPoolTaskRunner(workers, initializer=_init_worker,
                                             initargs=(visible, os.getpid(), ledger.path, ledger.owner.key))
                pool.__enter__()
                self._pools[visible] = pool
            return pool

    def _execute_in_process(self, task, task_run_id, parameters, wait_for, dependencies, tp):
        import cloudpickle
        from prefect.states import Crashed

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
            # The pool's workers are all dead now. It is shut down with the others, later: this task's
            # lease is released first.
            with self._pools_lock:
                if self._pools.get(tp.visible_devices) is pool:
                    self._broken_pools.append(self._pools.pop(tp.visible_devices))
            return Crashed(message=f"task {task.name!r} worker process died: {exc!r}")

    def cancel_all(self) -> None:
        """Also kill every process worker: all their tasks are cancelled, and a process is the only
        thing that stops a task for sure. Their futures fail with BrokenProcessPool, which ``_settle``
        turns into Cancelled. (Prefect's own ``cancel_all`` would wait for running tasks to finish, and
        neither it nor ProcessPoolExecutor before Python 3.14 offers a kill: hence their private fields.)"""
        super().cancel_all()
        with self._pools_lock:
            pools = list(self._pools.values())
        for pool in pools:
            executor = pool._executor
            for process in list((executor._processes or {}).values()) if executor is not None else []:
                process.kill()

    def _shutdown_backend(self) -> None:
        with self._pools_lock:
            pools, self._pools, self._broken_pools = [*self._pools.values(), *self._broken_pools], {}, []
        for pool in pools:
            pool.__exit__(None, None, None)
        with self._admitter_lock:
            admitter, self._admitter = self._admitter, None
        if admitter is not None:
            admitter.close()
