"""Salus on a real device: one executor per device admits torch jobs into memory lanes and hands out
iteration tokens (thesis Ch. 2, Fig. 2.3's life cycle: a session asks for a lane, then its iterations are
scheduled lane by lane).

``SalusExecutor`` holds the device's lease on the pool ledger for its whole life (as the serving runtime
does per node, ``tasks.serving.runtime``), so the pool charges Salus once for the device, not every job
``P + E`` on its own. Inside, a ``gpu.schedulers.salus.controller.SalusController`` decides; the executor is the
world around it: the clock is ``time.monotonic()`` since start, and the work is the jobs' own torch
iterations. A job marks its iterations with ``for step in salus_iterations(n):``; each pass waits for
the lane's token (the controller's ``Run``), runs, and returns the token with the iteration's measured
time, so switches happen only at iteration boundaries and a lane runs one iteration at a time.

Jobs are separate worker processes (``GpuTaskRunner(admission=SalusColocation(...))``'s default) or threads
(the runner's ``mode="thread"``). The token service is a Unix socket per executor with a line protocol (``ask N`` →
``go``, ``next SECONDS`` → ``go``, ``profiled SECONDS P E`` → ``go``, ``end SECONDS`` → ``ok``), which both
reach the same way: every boundary reports the iteration's measured seconds, and the first ``ask`` the number of
iterations the job's loop runs, so SRTF ranks jobs by what they measured (``gpu.schedulers.salus.estimates``).
We run jobs as processes because ``torch.cuda.set_per_process_memory_fraction`` can then
cap each job at its lane budget ``P + L_lane`` and a crashed job cannot take the executor with it. Threads
(one process, per-lane CUDA streams) would switch faster but cannot cap memory per job: one process, one cap, so
a job running in the executor's own process is not capped (``salus_iterations`` says so once).
A job whose connection drops mid-iteration (it raised, or its process died) gives the token back when
the runner tells the executor it left (``leave``): its lane shrinks and the others go on. A job that declared
no memory is profiled first (``admit`` of an ``Undeclared`` job, ``profiled``; ``tasks.salus.profiling``).
If the device's lease is lost, every waiting job is woken and its next token request raises.

A job that holds its lane's token past its bound (``gpu.schedulers.salus.overrun``: its process stopped, or hung
mid-iteration) loses it: a watchdog thread calls the controller's ``on_wake`` at ``token_deadline()``, the job's
lane is fenced with its memory, the lane's other jobs go on in a lane of their own, and the job is reported (a
warning naming it, its process and whether the process is stopped; ``status()``). Its process id comes from the
token connection (``SO_PEERCRED``). While the executor runs it is registered with the pool
(``gpu.schedulers.salus.live``), so ``gpuflows pool`` shows its lanes and token holders.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import json
import logging
import os
import socket
import socketserver
import struct
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from gpu.errors import ConfigError
from gpu.ledger import LedgerClient, Lease
from gpu.placement import ResourceRequest
from gpu.schedulers.salus.controller import Ask, Profiled, SalusController, SalusJob, SalusStep
from gpu.liveness import process_state
from gpu.schedulers.salus import live
from gpu.schedulers.salus.lanes import Margins
from gpu.schedulers.salus.overrun import Revoked, TokenBound
from gpu.units import parse_memory
from tasks.runtime.requests import current_placement
from tasks.runtime.slices import work_clock
from tasks.salus.placement import Lane, current_lane
from tasks.salus.profiling import MIB, CpuProbe, CudaProbe

PROFILE_ITERATIONS = 2  # iterations measured when a job declares no memory (the first one builds lazy state)
_ATTR = "__gpuflows_salus_job__"
_OVERRIDES: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("gpuflows_salus_options", default={})
_FIELDS = ("persistent", "ephemeral", "expected_s", "weight", "profile_iterations", "token_floor_s")
log = logging.getLogger("gpuflows.salus")


def salus_job(persistent: int | str | None = None, ephemeral: int | str | None = None,
              expected_s: float | None = None, weight: float = 1.0, profile_iterations: int = PROFILE_ITERATIONS,
              token_floor_s: float | None = None):
    """Mark a task as a Salus job. Its memory (bytes or ``"512MiB"``): persistent (model, optimizer state) and
    the per-iteration ephemeral peak (Observation 2: persistent is the small one) — both declared, or neither:
    then its first ``profile_iterations`` iterations run alone on the device and measure them
    (``tasks.salus.profiling``) before it is re-admitted with the measured sizes. ``expected_s``: total GPU
    time, for SRTF; ``weight``: weighted-FAIR share; ``token_floor_s``: the least time it may hold its lane's
    token before losing it (default: the executor's ``TokenBound.floor_s``). Works above or below ``@task``."""
    spec = _spec(persistent, ephemeral, expected_s=expected_s, weight=weight, profile_iterations=profile_iterations)
    if token_floor_s is not None:
        spec["token_floor_s"] = token_floor_s
    declared_job(spec, "declared")  # validate at import time

    def wrap(obj):
        setattr(getattr(obj, "fn", obj), _ATTR, spec)
        return obj

    return wrap


def _spec(persistent: int | str | None = None, ephemeral: int | str | None = None, **rest: Any) -> dict[str, Any]:
    out = dict(rest)
    if persistent is not None:
        out["persistent_mb"] = parse_memory(persistent, "persistent") / MIB
    if ephemeral is not None:
        out["ephemeral_mb"] = parse_memory(ephemeral, "ephemeral") / MIB
    return out


@contextlib.contextmanager
def salus_options(**overrides: Any) -> Iterator[None]:
    """Override ``salus_job`` fields (``persistent``, ``ephemeral``, ``expected_s``, ``weight``,
    ``profile_iterations``, ``token_floor_s``) for every task
    submitted inside this block — e.g. each job of a trace declaring its own expected time for SRTF."""
    unknown = set(overrides) - set(_FIELDS)
    if unknown:
        raise ConfigError("salus_options", sorted(unknown), f"unknown; use {', '.join(_FIELDS)}")
    token = _OVERRIDES.set({**_OVERRIDES.get(), **_spec(**overrides)})
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


@dataclass(frozen=True)
class Undeclared:
    """A Salus job that declared no memory: profiled over its first ``profile_iterations`` iterations."""

    job_id: str
    expected_s: float | None = None
    weight: float = 1.0
    profile_iterations: int = PROFILE_ITERATIONS
    token_floor_s: float | None = None

    def __post_init__(self) -> None:
        SalusJob(self.job_id, 1.0, 1.0, self.expected_s, self.weight,  # the same checks as a declared job
                 token_floor_s=self.token_floor_s)
        k = self.profile_iterations
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"jobs[{self.job_id}].profile_iterations", k, "must be a whole number >= 1")


def is_salus_job(task: Any) -> bool:
    """Whether a task runs as a Salus job: marked ``@salus_job``, or submitted inside a ``salus_options`` block.
    Any other task under ``GpuTaskRunner(admission=SalusColocation(...))`` takes a plain slice
    (``tasks.salus.admission``)."""
    return getattr(getattr(task, "fn", task), _ATTR, None) is not None or bool(_OVERRIDES.get())


def declared_job(task: Any, job_id: str) -> SalusJob | Undeclared:
    """The job a task declared with ``salus_job`` and ``salus_options``: a ``SalusJob`` with its sizes, or
    ``Undeclared`` (to be profiled) when it gave neither size. ConfigError naming the task if it is no Salus job
    or gave one size only, or naming the job's field if a value is bad (≤ 0, NaN)."""
    spec = task if isinstance(task, dict) else getattr(getattr(task, "fn", task), _ATTR, None)
    if spec is not None or _OVERRIDES.get():
        spec = {**(spec or {}), **_OVERRIDES.get()}
    name = getattr(task, "name", job_id)
    if spec is None:
        raise ConfigError("salus_job", name, "is no Salus job: mark it @salus_job (its memory declared, or left "
                                             "out to be profiled)")
    sizes = {"persistent_mb", "ephemeral_mb"} & set(spec)
    if len(sizes) == 1:
        raise ConfigError("salus_job", name, f"declares {sizes.pop()[:-3]} only: declare persistent and ephemeral "
                                             "memory, or neither to have both profiled")
    spec = dict(spec)
    profile_iterations = spec.pop("profile_iterations", PROFILE_ITERATIONS)
    if not sizes:
        return Undeclared(job_id, profile_iterations=profile_iterations, **spec)
    return SalusJob(job_id, on_demand=True, **spec)


@dataclass
class _Job:
    admitted: threading.Event
    turn: threading.Event
    lane: int | None = None


class SalusExecutor:
    """Salus for one device: admission into lanes, iteration tokens, and the device's lease.

    Args:
        ledger: the pool's ledger; the executor leases ``device`` whole (``lease=False``: the caller
            already holds it, e.g. a test or a flow that leased the device itself).
        device: device index on the pool.
        capacity_mb: the device's memory ``C`` (default: read from the pool's capacity).
        policy: ``fifo``/``pack``/``srtf``/``fair``/``weighted_fair``; ``admission`` and ``max_jobs`` as in
            ``SalusController`` (process mode: ``max_jobs`` = the worker processes the device has).
        token_bound: how long a job may hold its lane's token (``gpu.schedulers.salus.overrun``).
        pool: the pool name ``gpuflows pool --name`` shows this executor under (default: the ledger's pool file;
            none: not shown).
    """

    def __init__(self, ledger: LedgerClient | None, device: int, capacity_mb: float | None = None,
                 policy: str = "pack", margins: Margins = Margins(), admission: str | None = None,
                 max_jobs: int | None = None, lease: bool = True, allocation_timeout: float | None = None,
                 on_lost: Callable[["SalusExecutor", str], Any] | None = None,
                 token_bound: TokenBound = TokenBound(), pool: str | None = None):
        if capacity_mb is None:
            if ledger is None:
                raise ConfigError("capacity_mb", None, "needed when no ledger tells the device's memory")
            found = [d.memory_total for n in ledger.capacity for d in n.devices if d.index == device]
            if not found:
                raise ConfigError("device", device, "not a device of this pool")
            capacity_mb = found[0] / MIB
        self.device = device
        self.controller = SalusController(capacity_mb, policy, margins, admission, max_jobs, token_bound)
        ledger_file = str(getattr(ledger, "path", ""))
        self.pool = pool or (os.path.basename(ledger_file)[:-len(".sqlite")] if ledger_file.endswith(".sqlite")
                             else None)
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._t0 = time.monotonic()
        self._ledger = ledger
        self.placement: Lease | None = None
        self.lost: str | None = None
        self._on_lost = on_lost
        self.switches: deque[tuple[float, int, str]] = deque(maxlen=10_000)  # (now, lane, job): latest grants
        self.profiles: dict[str, tuple[float, float]] = {}  # job -> measured (P, E) MB, of jobs profiled here
        self.pids: dict[str, int] = {}  # job -> the process on its token connection
        self.revoked: deque[dict[str, Any]] = deque(maxlen=100)  # latest holders that lost the token, reported
        self.queued: set[str] = set()  # jobs Algorithm 2.1 found no lane for when they came (they waited for memory)
        self._closed = threading.Event()
        if lease and ledger is not None:
            self.placement = ledger.allocate(ResourceRequest(gpus=1, devices=(device,), label=f"salus-gpu{device}"),
                                             allocation_timeout)
            ledger.watch(self.placement.lease_id, self._lease_lost)
        self.address = os.path.join(tempfile.mkdtemp(prefix="gpuflows-salus-"), "token.sock")
        self._server = _TokenServer(self.address, self)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name=f"salus-token-gpu{device}",
                         daemon=True).start()
        threading.Thread(target=self._watch_tokens, name=f"salus-watch-gpu{device}", daemon=True).start()
        self._registered = live.register(self.pool, device, self.address) if self.pool else None

    # --- the world's clock --------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0

    def _apply(self, step: SalusStep) -> None:
        """Apply a controller decision (under the lock): wake admitted jobs and the jobs whose turn it is."""
        self.queued.update(step.queued)
        for a in step.admitted:
            job = self._jobs[a.job_id]
            job.lane = a.lane_id
            job.admitted.set()
        for run in step.runs:
            self.switches.append((self.now(), run.lane_id, run.job_id))
            self._jobs[run.job_id].turn.set()

    # --- token holders past their bound (gpu.schedulers.salus.overrun) ---------------------------------------
    def _watch_tokens(self) -> None:
        """Wake the controller when a token holder's bound passes (its ``token_deadline``; at least every second,
        as new grants come), and report every holder that lost its token."""
        while True:
            with self._lock:
                deadline = self.controller.token_deadline()
            wait = 1.0 if deadline is None else min(1.0, max(0.01, deadline - self.now()))
            if self._closed.wait(wait):
                return
            with self._lock:
                if self.lost:
                    continue
                step = self.controller.on_wake(self.now())
                self._apply(step)
            for revoked in step.revoked:
                self._report(revoked)

    def _report(self, revoked: Revoked) -> None:
        pid = self.pids.get(revoked.job_id)
        process = live.process_word(process_state(pid)) if pid else "unknown"
        self.revoked.append({"job": revoked.job_id, "lane": revoked.lane_id, "held_s": revoked.held_s,
                             "bound_s": revoked.bound_s, "at_s": self.now(), "pid": pid, "process": process})
        log.warning("Salus gpu%s: job %s held lane %s's token %.1f s, past its bound of %.1f s (process %s %s); it "
                    "lost the token and its lane is fenced with its memory until it reaches its iteration boundary "
                    "(then it waits for the token again) or leaves; the lane's other jobs go on beside it",
                    self.device, revoked.job_id, revoked.lane_id, revoked.held_s, revoked.bound_s, pid or "", process)

    def status(self) -> dict[str, Any]:
        """What ``gpuflows pool`` shows (``gpu.schedulers.salus.live.describe``): lanes, their jobs, each token's
        holder (for how long, its bound, whether it lost the token, its process and whether that is stopped),
        the queue and the latest revoked holders."""
        with self._lock:
            now, ctl = self.now(), self.controller
            holders = {h.lane_id: h for h in ctl.token_holders(now)}
            fenced = ctl.lanes.fenced
            lanes = []
            for view in ctl.lane_views():
                hold = holders.get(view.lane_id)
                pid = self.pids.get(hold.job_id) if hold else None
                lanes.append({"lane": view.lane_id, "size_mb": view.size_mb, "jobs": list(view.jobs),
                              "fenced": view.lane_id in fenced, "in_place": view.settled,
                              "holder": None if hold is None else {
                                  "job": hold.job_id, "held_s": hold.held_s, "bound_s": hold.bound_s,
                                  "revoked": hold.revoked, "pid": pid,
                                  "process": live.process_word(process_state(pid)) if pid else "unknown"}})
            return {"device": self.device, "pid": os.getpid(), "policy": ctl.policy, "lanes": lanes,
                    "jobs": len(ctl.lanes.persistent), "queue": list(ctl.queue), "used_mb": ctl.lanes.used_mb(),
                    "usable_mb": ctl.lanes.usable_mb, "lost": self.lost, "revoked": list(self.revoked)}

    def connected(self, job_id: str, pid: int) -> None:
        """A job's process opened its token connection."""
        self.pids[job_id] = pid

    # --- admission (the runner's dispatcher threads) -------------------------------------------------------
    def admit(self, job: SalusJob | Undeclared, cancel_event: threading.Event | None = None,
              timeout: float | None = None) -> Lane:
        """Queue ``job`` until Algorithm 2.1 gives it a lane; returns the lane (bad job: ConfigError or
        NeverFitsError at once; ``cancel_event`` set → InterruptedError; ``timeout`` → TimeoutError).

        An ``Undeclared`` job is admitted to be profiled: it reserves the whole usable device (so it waits for
        an empty device, and nothing else is admitted beside it), and its lane says how many iterations to
        measure before it comes back through ``profiled``."""
        self._check_lease()
        profile = job.profile_iterations if isinstance(job, Undeclared) else 0
        if profile:
            job = self._whole_device(job)
        with self._lock:
            if job.job_id in self._jobs:
                raise ConfigError("job_id", job.job_id, "already on this executor")
            self._jobs[job.job_id] = state = _Job(threading.Event(), threading.Event())
            try:
                self._apply(self.controller.on_arrival(self.now(), job))
            except BaseException:
                del self._jobs[job.job_id]
                raise
        self._wait_admitted(job.job_id, state, cancel_event, timeout)
        with self._lock:
            return dataclasses.replace(self._lane(job.job_id, state), profile_iterations=profile)

    def _whole_device(self, job: Undeclared) -> SalusJob:
        """The reservation a job is profiled under: 1 MB persistent and every other usable MB as its lane."""
        lanes = self.controller.lanes
        p, _ = lanes.margins.charge(1.0, 0.0)
        return SalusJob(job.job_id, 1.0, (lanes.usable_mb - p) / lanes.margins.total, job.expected_s, job.weight,
                        on_demand=True, token_floor_s=job.token_floor_s)

    def _wait_admitted(self, job_id: str, state: _Job, cancel_event: threading.Event | None,
                       timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not state.admitted.wait(0.05):
            stop = cancel_event is not None and cancel_event.is_set()
            late = deadline is not None and time.monotonic() > deadline
            if stop or late or self.lost:
                self.leave(job_id)
                self._check_lease()
                if late:
                    raise TimeoutError(f"job {job_id} was not admitted on gpu{self.device} within {timeout}s")
                raise InterruptedError(f"job {job_id} stopped waiting for a Salus lane")

    def _lane(self, job_id: str, state: _Job) -> Lane:
        """The job's lane with its budget ``P + L_lane`` (under the lock)."""
        lanes = self.controller.lanes
        cap = int((lanes.persistent[job_id] + lanes.lane_size(state.lane)) * MIB)
        return Lane(state.lane, job_id, cap, self.address, host_pid=os.getpid())

    def profiled(self, job_id: str, gpu_s: float, persistent_mb: float, ephemeral_mb: float) -> Lane:
        """The job's last profiling iteration ended after ``gpu_s`` with these measured sizes: it gives the token
        back, is re-admitted with them (Alg. 2.1, before any queued job: its memory is resident), and waits for
        its next iteration. Returns its new lane (a measured size that never fits the device: NeverFitsError)."""
        with self._lock:
            state = self._admitted(job_id)
            self._apply(self.controller.on_iteration(self.now(), job_id, gpu_s))
            state.admitted.clear()
            self._apply(self.controller.on_arrival(self.now(), Profiled(job_id, persistent_mb, ephemeral_mb)))
            self.profiles[job_id] = (persistent_mb, ephemeral_mb)
        self._wait_admitted(job_id, state, None, None)
        self.ask(job_id)
        with self._lock:
            return self._lane(job_id, state)

    def leave(self, job_id: str) -> None:
        """The job ended (any way, mid-iteration included): free its memory and token, shrink its lane."""
        with self._lock:
            state = self._jobs.pop(job_id, None)
            if state is None:
                return
            state.turn.set()  # a thread still waiting for a token stops waiting
            self.pids.pop(job_id, None)
            self._apply(self.controller.on_job_done(self.now(), job_id, 0.0))

    # --- tokens (the token server's threads) ----------------------------------------------------------------
    def ask(self, job_id: str, iterations: int | None = None) -> int:
        """Block until the job's lane runs its next iteration; return the lane. ``iterations``: the job's loop
        starts and runs that many (SRTF's iterations left)."""
        with self._lock:
            state = self._admitted(job_id)
            state.turn.clear()
            self._apply(self.controller.on_arrival(self.now(), Ask(job_id, iterations)))
        return self._wait_turn(job_id, state)

    def _admitted(self, job_id: str) -> _Job:
        """The admitted job's state (under the lock), if the device's lease still holds."""
        state = self._jobs.get(job_id)
        if state is None:
            raise ConfigError("job_id", job_id, "not admitted on this executor")
        self._check_lease()
        return state

    def _check_lease(self) -> None:
        if self.lost:
            raise RuntimeError(f"Salus executor of gpu{self.device} lost its device lease: {self.lost}")

    def _wait_turn(self, job_id: str, state: _Job) -> int:
        state.turn.wait()
        self._check_lease()
        if job_id not in self._jobs:
            raise InterruptedError(f"job {job_id} left while waiting for its token")
        return state.lane

    def end(self, job_id: str, gpu_s: float, more: bool = False) -> int | None:
        """The job's iteration is over after ``gpu_s`` seconds: the token goes to the policy's next pick.
        ``more``: the job wants its next iteration too — block until it gets it and return the lane."""
        with self._lock:
            state = self._admitted(job_id)
            state.turn.clear()
            self._apply(self.controller.on_iteration(self.now(), job_id, gpu_s, more=more))
        if not more:
            return None
        return self._wait_turn(job_id, state)

    # --- lifetime -----------------------------------------------------------------------------------------
    def _lease_lost(self, reason: str) -> None:
        """The ledger took the device's lease away (heartbeat expiry, reclaim): no job may run here any more.
        Every job waiting for a lane or a token stops waiting (its ``salus_iterations`` raises), and
        ``on_lost`` tells the runner, which ends the jobs instead of letting them hang."""
        with self._lock:
            self.lost = reason
            for state in self._jobs.values():
                state.turn.set()
        if self._on_lost is not None:
            self._on_lost(self, reason)

    def close(self) -> None:
        """Stop the token service and give the device's lease back."""
        self._closed.set()
        if self._registered is not None:
            self._registered.unlink(missing_ok=True)
        self._server.shutdown()
        self._server.server_close()
        for path in (self.address, os.path.dirname(self.address)):
            try:
                os.remove(path) if path == self.address else os.rmdir(path)
            except OSError:
                pass
        if self.placement is not None and self._ledger is not None:
            self._ledger.release(self.placement.lease_id)
            self.placement = None

    def __enter__(self) -> "SalusExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _TokenHandler(socketserver.StreamRequestHandler):
    """One job's connection: ``ask JOB [ITERATIONS]`` → ``go LANE``; ``next JOB SECONDS`` (end this iteration, run the
    next) → ``go LANE``; ``profiled JOB SECONDS P_MB E_MB`` (end the last profiling iteration, be re-admitted,
    run the next) → ``go LANE CAP_BYTES``; ``end JOB SECONDS`` → ``ok``; errors → ``err WHY``."""

    def handle(self) -> None:
        executor: SalusExecutor = self.server.executor  # type: ignore[attr-defined]
        pid = _peer_pid(self.request)
        for raw in self.rfile:
            verb, *args = raw.decode().split()
            try:
                if verb == "status":
                    self.wfile.write((json.dumps(executor.status()) + "\n").encode())
                    continue
                if verb == "ask" and pid:
                    executor.connected(args[0], pid)
                if verb == "ask":
                    reply = f"go {executor.ask(args[0], int(args[1]) if len(args) > 1 else None)}"
                elif verb == "next":
                    reply = f"go {executor.end(args[0], float(args[1]), more=True)}"
                elif verb == "profiled":
                    lane = executor.profiled(args[0], *map(float, args[1:4]))
                    reply = f"go {lane.lane_id} {lane.memory_cap}"
                elif verb == "end":
                    executor.end(args[0], float(args[1]))
                    reply = "ok"
                else:
                    reply = f"err unknown verb {verb}"
            except Exception as exc:  # noqa: BLE001 - the job learns why, the executor goes on
                reply = f"err {exc}"
            self.wfile.write((reply + "\n").encode())


def _peer_pid(sock: socket.socket) -> int:
    """The process at the other end of a Unix socket (Linux ``SO_PEERCRED``; 0 where unavailable)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return 0
    pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid


class _TokenServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, address: str, executor: SalusExecutor):
        self.executor = executor
        super().__init__(address, _TokenHandler)


@contextlib.contextmanager
def _token_channel(address: str) -> Iterator[tuple[Any, Any]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    reader, writer = sock.makefile("r"), sock.makefile("w")
    try:
        yield reader, writer
    finally:
        reader.close(), writer.close(), sock.close()


def _call(reader: Any, writer: Any, line: str) -> str:
    writer.write(line + "\n")
    writer.flush()
    reply = reader.readline().strip()
    if not reply or reply.startswith("err"):
        raise RuntimeError(f"Salus token service: {reply or 'connection closed'}")
    return reply


def salus_iterations(n: int, lane: Lane | None = None, release_cache: bool = True) -> Iterator[int]:
    """``for step in salus_iterations(n):`` — each pass is one iteration run while holding the lane's token.

    Outside Salus (no lane in the task's placement) it is ``range(n)``. The first token request says ``n`` and
    every boundary the iteration's measured seconds (SRTF ranks by them). On CUDA a job in a worker process of its
    own is capped at its lane budget ``P + L_lane`` first (a job in the executor's process is not: one process,
    one cap), each iteration is timed after a synchronise, and with
    ``release_cache`` the allocator's cached blocks (this iteration's ephemeral memory) go back to the
    device before the token does, so the lane's next job finds its ephemeral space free. A job admitted to be
    profiled (``lane.profile_iterations``) has its first iterations measured (``tasks.salus.profiling``: on
    CUDA the allocator's statistics, else the tensors its frame holds and ``torch.profiler``'s allocations), is
    re-admitted with the measured ``P`` and ``E``, and goes on under its new lane's budget.
    """
    lane = lane or current_lane()
    if lane is None:
        yield from range(n)
        return
    device = _cuda_device()
    _cap_memory(device, lane, lane.memory_cap)
    if n <= 0:
        return
    clock = work_clock(device is not None)  # on the CPU the job's thread time: other load is not the job's cost
    frame = inspect.currentframe().f_back  # the job's own frame: what it holds between iterations
    probe = _probe(device) if lane.profile_iterations else None
    stops_profiling = contextlib.nullcontext() if probe is None else contextlib.closing(probe)
    with _token_channel(lane.token) as (reader, writer), stops_profiling:
        _call(reader, writer, f"ask {lane.job_id} {n}")
        for step in range(n):
            profiling = probe is not None and step < lane.profile_iterations
            if profiling:
                probe.start(frame)
            start = clock()
            yield step
            if device is not None:
                device[0].synchronize(device[1])
            seconds = clock() - start
            if profiling:
                probe.stop(frame)
            if device is not None and release_cache:
                device[0].empty_cache()
            if profiling and step == lane.profile_iterations - 1 and step < n - 1:
                p_mb, e_mb = probe.profile.sizes_mb()
                cap = int(_call(reader, writer, f"profiled {lane.job_id} {seconds:.6f} {p_mb:.6f} {e_mb:.6f}"
                                ).split()[2])
                _cap_memory(device, lane, cap)
                continue
            verb = "next" if step < n - 1 else "end"
            _call(reader, writer, f"{verb} {lane.job_id} {seconds:.6f}")


def _cuda_device() -> tuple[Any, Any] | None:
    """``(torch.cuda, device)`` of the running task's placement, or None on a simulated pool / CPU."""
    placement = current_placement()
    if placement is None or not placement.device.startswith("cuda"):
        return None
    import torch

    return torch.cuda, torch.device(placement.device)


_UNCAPPED: set[Any] = set()  # devices whose jobs in the executor's process were already reported uncapped


def _cap_memory(device: tuple[Any, Any] | None, lane: Lane, cap: int) -> None:
    """Cap the job's allocations on its CUDA device at ``cap`` bytes (its lane budget), where the job is its
    process's only one: a worker process of its own (the runner's process mode). The cap is per process
    (``set_per_process_memory_fraction``), so in the executor's own process (thread mode) it would bind every job
    there at once, each to one job's budget: it is left off, and a warning says so once per device."""
    if device is None:
        return
    cuda, dev = device
    if lane.host_pid == os.getpid():
        if dev not in _UNCAPPED:
            _UNCAPPED.add(dev)
            log.warning("Salus on %s: jobs run as threads of the executor's process, which has one CUDA allocator "
                        "and one memory cap; no job is capped at its lane budget (run them in worker processes, "
                        "the runner's mode='process', to cap each)", dev)
        return
    cuda.set_per_process_memory_fraction(min(1.0, cap / cuda.get_device_properties(dev).total_memory), dev)


def _probe(device: tuple[Any, Any] | None) -> CudaProbe | CpuProbe:
    return CpuProbe() if device is None else CudaProbe(*device)


def new_job_id(task_name: str) -> str:
    return f"{task_name}-{uuid.uuid4().hex[:8]}"
