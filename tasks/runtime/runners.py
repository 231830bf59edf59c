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
import threading
import time
import uuid
from concurrent.futures import BrokenExecutor, CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from types import EllipsisType
from typing import Any, Callable, Iterable

from prefect.futures import PrefectConcurrentFuture, PrefectFuture, wait
from prefect.task_runners import TaskRunner
from prefect.utilities.annotations import allow_failure, quote
from prefect.utilities.collections import StopVisiting, visit_collection

from gpu.devices import nvml_readings
from gpu.errors import AllocationTimeout, ConfigError, NeverFitsError
from gpu.ledger import LedgerClient, Lease
from gpu.placement import ResourceRequest, check_ever_fits
from resource_blocks import GpuPool, MlflowTarget, SchedulerPolicy
from tasks.runtime.admission import Admission, AdmissionHost, Admitter
from tasks.runtime.requests import PLACEMENT_ENV, TaskPlacement, placed, resolve_requests
from tasks.runtime.tracking import RunTracker, TaskRecord, flow_tracker, task_fields
from tasks.runtime.workers import WorkerKey, WorkerPool, task_environment

_CANCEL_GRACE = 2.0       # seconds __exit__ gives cancelled tasks to stop and release their leases
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


def _upstream_futures(parameters: dict[str, Any],
                      wait_for: Iterable[Any] | None) -> list[tuple[PrefectFuture, bool]]:
    """Every future the task waits for, in its parameters and ``wait_for``, each with whether it may fail
    (``allow_failure``); futures inside ``quote`` are data, not upstreams (Prefect's engine resolves likewise)."""
    found: list[tuple[PrefectFuture, bool]] = []

    def visit(expr: Any, context: dict[str, Any]) -> Any:
        annotation = context.get("annotation")
        if isinstance(annotation, quote):
            raise StopVisiting()
        if isinstance(expr, PrefectFuture):
            found.append((expr, isinstance(annotation, allow_failure)))
        return expr

    visit_collection([parameters, list(wait_for or [])], visit_fn=visit, return_data=False, context={})
    return found


def _usable(state, may_fail: bool) -> bool:
    """Whether Prefect's engine would run a task with this upstream state (``resolve_to_final_result``)."""
    return state.is_completed() or may_fail and (state.is_failed() or state.is_pending() and state.name == "NotReady")


def wait_for_states(wait_for: Iterable[Any] | None) -> list[Any] | None:
    """``wait_for`` with each future replaced by its final state (``allow_failure`` kept around it), for an engine
    in another process: states pickle, futures do not."""
    if not wait_for:
        return None
    return visit_collection(list(wait_for), visit_fn=lambda e: e.state if isinstance(e, PrefectFuture) else e,
                            return_data=True)


class EngineRaised(Exception):
    """Prefect's task engine raised instead of returning a final state (one of its own checks failed: a task
    depending on itself, an input it cannot resolve). The task's future raises ``error``, as under Prefect's own
    runners, once the task's lease is settled: not a crash of the runner."""

    def __init__(self, error: BaseException):
        super().__init__(repr(error))
        self.error = error


def run_engine_here(task, task_run_id: uuid.UUID, parameters: dict[str, Any], wait_for: Iterable[Any] | None,
                    dependencies: dict[str, set] | None, tp: TaskPlacement | None, cancel_event: threading.Event):
    """Run the task through Prefect's engine in this thread (thread mode, and tasks that will not run); its final
    State. What the engine raises is Prefect's own error (``EngineRaised``)."""
    from prefect.task_engine import run_task_async, run_task_sync

    kwargs = dict(task=task, task_run_id=task_run_id, parameters=parameters, wait_for=wait_for,
                  return_type="state", dependencies=dependencies, context=dict(cancel_event=cancel_event))
    with placed(tp):
        try:
            if task.isasync:
                return asyncio.run(run_task_async(**kwargs))
            return run_task_sync(**kwargs)
        except Exception as exc:  # noqa: BLE001 - not the task's failure (the engine records that): its own
            raise EngineRaised(exc) from exc


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
        self._lingering: dict[uuid.UUID, list[tuple[int, int]]] = {}  # task run -> its processes outliving it
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
        """Runs in a dispatcher thread: upstream -> lease -> execute -> release -> settle the final state.

        A task that will not run (an upstream it may not do without did not complete, or it waits for itself)
        takes no slice: Prefect's engine decides its state here, in the flow process (``NotReady``, or its own
        error), exactly as under Prefect's runners. An error Prefect's engine raised reaches the task's future
        (``EngineRaised``); only the backend breaking is a crash."""
        from prefect.states import Cancelled, Crashed, Failed

        upstream = _upstream_futures(parameters, wait_for)
        others = [f for f, _ in upstream if f.task_run_id != task_run_id]  # waiting for itself would never end
        if others:
            wait(others)
        ready = len(others) == len(upstream) and all(_usable(f.state, may_fail) for f, may_fail in upstream)
        placement: Lease | None = None
        lost: str | None = None
        raised: BaseException | None = None
        try:
            if cancel_event.is_set():
                raise InterruptedError(f"task {task.name!r} was cancelled before it started")
            if not ready:
                state = run_engine_here(task, task_run_id, parameters, wait_for, dependencies, None, cancel_event)
            else:
                placement = self._acquire_preferred(task, task_run_id, requests, cancel_event)
                record.placement = placement.to_dict()
                record.placed_at = time.time()
                if cancel_event.is_set():
                    raise InterruptedError(f"task {task.name!r} was cancelled before it started")
                state = self._execute(task, task_run_id, parameters, wait_for, dependencies, placement, cancel_event)
        except EngineRaised as exc:
            raised, state = exc.error, Failed(message=f"Prefect's task engine raised {exc.error!r}")
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
        if raised is None:
            state = self._settle(task, task_run_id, state, cancel_event, lost)
        record.state = state.type.value
        if self._tracker is not None:
            self._tracker.task_finished(record)
        if raised is not None:
            raise raised
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

        Processes the task left that may still run on the slice (``_lingering``, process mode) keep it: the
        ledger frees it once they are dead (``PoolLedger.release(linger=...)``).

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
        with self._leases_lock:
            linger = self._lingering.pop(self._held.get(lease_id), ())
        while released is None:
            try:
                released = self._ledger.release(lease_id, linger=linger) if linger else self._ledger.release(lease_id)
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

    def _worker_context(self, task, task_run_id: uuid.UUID,
                        parameters: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """Prefect's serialized context and settings env for running a task in another process.

        Each costs ~20 ms of CPU per call (Prefect's process runner computes them once per runner).
        They are cached while the submitting contexts are the same objects and the tags are equal,
        so a submission under other tags or settings, or from inside a task, still gets its own.
        The task's asset context is built here, in the flow process, as prefect-ray's runner does: it reads
        the assets upstream tasks recorded in the flow run's context (``prefect.asset.referenced`` events
        downstream), and records this task's own for the tasks after it.
        """
        from prefect.context import (
            AssetContext, EngineContext, SettingsContext, TagsContext, TaskRunContext, serialize_context,
        )
        from prefect.settings import get_current_settings
        from prefect.utilities.engine import collect_task_run_inputs_sync

        objects = (EngineContext.get(), TaskRunContext.get(), SettingsContext.get())
        tags = frozenset(TagsContext.get().current_tags)
        cached = self._context_cache
        if cached is None or cached[0][1] != tags or any(a is not b for a, b in zip(cached[0][0], objects)):
            cached = ((objects, tags), serialize_context(),
                      get_current_settings().to_environment_variables(exclude_unset=True))
            self._context_cache = cached
        inputs = {k: collect_task_run_inputs_sync(v) for k, v in parameters.items()}
        assets = AssetContext.from_task_and_inputs(task, task_run_id, inputs, copy_to_child_ctx=True)
        return {**cached[1], "asset_context": assets.serialize()}, cached[2]

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


class GpuTaskRunner(PlacingTaskRunner):
    """Places each task on a slice of a GPU pool and runs it locally.

    Args:
        pool: the GpuPool block (default: NVML GPUs, else a simulated 2 x 16 GiB pool).
        mode: ``"process"`` (default; CUDA_VISIBLE_DEVICES and the MPS share per task, each task in a worker
            process of its own while it runs: ``tasks.runtime.workers``) or ``"thread"`` (CPU-only work, lowest
            overhead; the placement's device string carries the GPU index instead).
        workers_per_device_set: processes kept per set of visible devices and MPS share (process mode).
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
        self._workers: WorkerPool | None = None
        self._workers_lock = threading.Lock()

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
            return run_engine_here(task, task_run_id, parameters, wait_for, dependencies, tp, cancel_event)
        return self._execute_in_process(task, task_run_id, parameters, wait_for, dependencies, tp, cancel_event)

    def _worker_pool(self) -> WorkerPool:
        """The process workers, created on first use."""
        with self._workers_lock:
            if self._workers is None:
                ledger = self._ensure_ledger()
                per_key = self.workers_per_device_set if self.admission is None else \
                    self.admission.worker_processes(self.workers_per_device_set)
                self._workers = WorkerPool(per_key, lambda: (os.getpid(), ledger.path, ledger.owner.key))
            return self._workers

    def _execute_in_process(self, task, task_run_id, parameters, wait_for, dependencies, tp, cancel_event):
        """Run the task in a worker process of its placement's ``WorkerKey``, alone there while it runs.

        Whatever the task left running in the worker's group is killed when it ends; what outlives the kill keeps
        the task's slice (``_lingering``). A worker that died crashes only its own task."""
        import cloudpickle
        from prefect.states import Crashed
        from prefect.task_runners import _run_task_in_subprocess
        from prefect.utilities.callables import cloudpickle_wrapped_call
        from prefect.utilities.engine import resolve_inputs_sync

        key = WorkerKey.of(tp)
        workers = self._worker_pool()
        context, settings_env = self._worker_context(task, task_run_id, parameters)
        env = task_environment(settings_env | dict(os.environ) | api_url_env() | {PLACEMENT_ENV: tp.to_env()}, key)
        # Prefect's process runner pickles the call and forwards logs and events; the placement travels in env
        call = cloudpickle_wrapped_call(
            _run_task_in_subprocess, env=env, task=task, task_run_id=task_run_id,
            parameters=resolve_inputs_sync(parameters, return_data=True, max_depth=-1),
            wait_for=wait_for_states(wait_for), return_type="state", dependencies=dependencies, context=context)
        worker = workers.take(key, cancel_event)
        died = False
        try:
            try:
                return cloudpickle.loads(worker.submit(call).result())
            except BrokenExecutor as exc:
                died = True
                return Crashed(message=f"task {task.name!r} worker process died: its process (pid {worker.pid}) "
                                       f"{worker.death()} ({exc!r})")
            except Exception as exc:  # noqa: BLE001 - raised by Prefect's engine in the worker
                raise EngineRaised(exc) from exc
        finally:
            killed, survivors = worker.stop_leftovers()
            if killed:
                self.logger.warning("task %r left %d process(es) running when it ended (pids %s): killed%s",
                                    task.name, len(killed), killed,
                                    f"; {len(survivors)} still alive keep its slice until they die" if survivors
                                    else "")
            if survivors:
                with self._leases_lock:
                    self._lingering[task_run_id] = survivors
            if died:
                workers.retire(worker)
            else:
                workers.give_back(worker)

    def cancel_all(self) -> None:
        """Also kill every process worker and what its task started: all their tasks are cancelled, and killing
        a process is the only thing that stops a task for sure. Their futures fail with BrokenProcessPool, which
        ``_settle`` turns into Cancelled. (Prefect's own ``cancel_all`` would wait for running tasks to finish,
        and ProcessPoolExecutor before Python 3.14 offers no kill.)"""
        super().cancel_all()
        with self._workers_lock:
            workers = self._workers
        if workers is not None:
            workers.kill_all()

    def _shutdown_backend(self) -> None:
        with self._workers_lock:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.close()
        with self._admitter_lock:
            admitter, self._admitter = self._admitter, None
        if admitter is not None:
            admitter.close()
