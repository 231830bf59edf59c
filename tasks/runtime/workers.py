"""The worker processes of ``GpuTaskRunner``'s process mode: one process per running task, and nothing a task
started outlives it.

**One process per pool.** Each worker is a one-process ``ProcessPoolTaskRunner`` (Prefect's own machinery:
context hydration, log and event forwarding). When a process of a shared ``ProcessPoolExecutor`` dies, Python
fails every running future of the pool and tells the other processes to stop: a healthy sibling's task would end
with its neighbour's crash, while its process, still computing on its slice, went on unseen. Alone in its pool, a
worker's death ends only the task it ran.

**Keyed by what CUDA reads at start.** ``CUDA_VISIBLE_DEVICES`` and MPS's active-thread percentage are read when a
process creates its CUDA context, so a worker only ever serves tasks with the same visible devices and the same
compute share (``WorkerKey``; ``tasks.runtime.slices.mps_environment``, empty where no MPS daemon listens).

**A task's processes end with it** (as a Slurm job step's or a Kubernetes pod's do). A worker leads a session of
its own and carries its mark in its environment (``gpu.liveness.group_members``), so whatever a task starts, a
double-forked daemon included, stays findable after the worker itself is gone. When a task ends, however it ends,
the rest of its worker's group is killed (``Worker.stop_leftovers``) and its slice is freed only once they are
dead: what survives the kill is handed to the ledger (``PoolLedger.release(linger=...)``), which keeps the slice
until it dies. If the flow process dies, each worker kills its group and itself (``_watch_parent``), and the
ledger keeps the flow's slices while any process of a registered worker group lives (``register_worker``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpu.ledger import register_worker
from gpu.liveness import WORKER_MARK_ENV, group_members, process_alive, process_start, worker_mark
from tasks.runtime.requests import TaskPlacement
from tasks.runtime.slices import MPS_THREADS_ENV, mps_environment

WATCHDOG_INTERVAL_S = 0.1  # between a worker's checks that its flow process lives
TAKE_POLL_S = 0.1          # how often a task waiting for a free worker looks at its cancel event
STOP_GRACE_S = 2.0         # how long the runner waits for killed leftovers to die before the ledger takes over


@dataclass(frozen=True)
class WorkerKey:
    """What a worker process fixes when it starts: its visible devices and MPS compute share."""

    visible: str
    mps: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, placement: TaskPlacement) -> "WorkerKey":
        mps = mps_environment(placement.fraction) if placement.gpu_indices else {}
        return cls(placement.visible_devices, tuple(sorted(mps.items())))

    def environment(self) -> dict[str, str]:
        """The worker's CUDA environment (also laid over each task's, so the flow's own values never override it)."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": self.visible, **dict(self.mps)}


@dataclass(eq=False)
class Worker:
    """One worker process (its own one-process pool) and what the runner knows of it."""

    key: WorkerKey
    pool: Any  # prefect.task_runners.ProcessPoolTaskRunner with one process
    process: Any = None  # its multiprocessing Process, known once it ran a task
    pstart: int = 0

    def submit(self, call: Callable[[], Any]):
        """Run ``call`` (a cloudpickle-wrapped task call) in this worker; its concurrent future."""
        future = self.pool._executor.submit(call)
        if self.process is None:  # started by this first submission
            (self.process,) = self.pool._executor._processes.values()
            self.pstart = process_start(self.process.pid)
        return future

    def usable(self) -> bool:
        """Whether its pool can take a task (its process did not die while idle)."""
        executor = self.pool._executor
        return executor is not None and not executor._broken

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def death(self) -> str:
        """How the process ended, for a task's message ("killed by SIGKILL", "exited with code 1")."""
        if self.process is None:
            return "died"
        deadline = time.monotonic() + 2.0  # reaped by the pool's manager thread or here, its code is known then
        while (code := self.process.exitcode) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if code is None:
            return "died"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def leftovers(self) -> list[int]:
        """Live processes of this worker's group other than the worker itself (``gpu.liveness.group_members``)."""
        if self.process is None:
            return []
        (members,) = group_members([(self.process.pid, self.pstart)]).values()
        return [pid for pid in members if pid != self.process.pid]

    def stop_leftovers(self, grace: float = STOP_GRACE_S) -> tuple[list[int], list[tuple[int, int]]]:
        """Kill what the worker's last task left running (everything of its group but the worker) and wait up to
        ``grace`` seconds for it to die. Returns the pids killed and the (pid, start time) of those still
        alive: the ledger keeps the task's slice until they die."""
        killed: set[int] = set()
        starts: dict[int, int] = {}
        deadline = time.monotonic() + grace
        while True:
            left = self.leftovers()  # looked for again: a process may have forked before it was killed
            for pid in left:
                starts.setdefault(pid, process_start(pid))
                _kill(pid)
            killed.update(left)
            if not left or time.monotonic() > deadline:
                return sorted(killed), [(pid, starts[pid]) for pid in left if process_alive(pid, starts[pid])]
            time.sleep(0.02)

    def kill(self) -> None:
        """Kill the worker and its whole group at once (cancellation)."""
        if self.process is None:
            return
        for pid in [*self.leftovers(), self.process.pid]:
            _kill(pid)


@dataclass
class _Slots:
    workers: list[Worker] = field(default_factory=list)
    idle: list[Worker] = field(default_factory=list)


class WorkerPool:
    """The runner's workers: at most ``per_key`` per ``WorkerKey``, each running one task at a time.

    ``initargs(key)`` gives ``_init_worker``'s arguments after the key's environment."""

    def __init__(self, per_key: int, initargs: Callable[[], tuple]):
        self.per_key = per_key
        self._initargs = initargs
        self._slots: dict[WorkerKey, _Slots] = {}
        self._retired: list[Worker] = []
        self._changed = threading.Condition()

    def take(self, key: WorkerKey, cancel_event: threading.Event) -> Worker:
        """An idle worker of ``key`` (a new one while fewer than ``per_key`` exist), waiting for one to be given
        back if need be; InterruptedError once ``cancel_event`` is set."""
        from prefect.task_runners import ProcessPoolTaskRunner

        with self._changed:
            slots = self._slots.setdefault(key, _Slots())
            while not slots.idle and len(slots.workers) >= self.per_key:
                if cancel_event.is_set():
                    raise InterruptedError("cancelled while waiting for a worker process")
                self._changed.wait(TAKE_POLL_S)
            while slots.idle:
                worker = slots.idle.pop()
                if worker.usable():
                    return worker
                slots.workers.remove(worker)  # its process died while idle: replaced below
                self._retired.append(worker)
            pool = ProcessPoolTaskRunner(1, initializer=_init_worker, initargs=(key.environment(), *self._initargs()))
            worker = Worker(key, pool)
            slots.workers.append(worker)
        pool.__enter__()
        return worker

    def give_back(self, worker: Worker) -> None:
        """The worker's task ended and its process lives: it may take the next task of its key."""
        with self._changed:
            self._slots[worker.key].idle.append(worker)
            self._changed.notify_all()

    def retire(self, worker: Worker) -> None:
        """The worker's process died: a new process takes its place on the next ``take``; its pool is shut
        down with the others (``close``)."""
        with self._changed:
            self._slots[worker.key].workers.remove(worker)
            self._retired.append(worker)
            self._changed.notify_all()

    def kill_all(self) -> None:
        """Kill every worker and whatever its task started (their tasks end; cancellation)."""
        with self._changed:
            workers = [w for slots in self._slots.values() for w in slots.workers]
        for worker in workers:
            worker.kill()

    def close(self) -> None:
        """Stop every worker (after every task ended)."""
        with self._changed:
            workers = [w for slots in self._slots.values() for w in slots.workers] + self._retired
            self._slots, self._retired = {}, []
        for worker in workers:
            worker.pool.__exit__(None, None, None)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _init_worker(environment: dict[str, str], parent_pid: int, ledger_path: str, owner_key: str) -> None:
    """Process-pool initializer: pin the CUDA environment before anything can start CUDA, make this worker the
    head of a group that holds whatever its tasks start, and make it die with the flow process ``parent_pid``
    that holds the leases of its tasks.

    The worker starts a session of its own (``os.setsid``) and marks its environment (``WORKER_MARK_ENV``):
    both are inherited by every process it starts (``gpu.liveness.group_members``). Being out of the flow's
    process group also keeps the SIGINT/SIGTERM that ``serve()``, a Prefect worker or Ctrl-C send to that group
    from reaching it: the flow process handles them, cancels the tasks and kills the workers, so the tasks are
    recorded Cancelled rather than each worker dying on its own as a crash.

    A watchdog thread polls ``os.getppid()``: when the flow process dies, however (``kill -9`` included), the
    worker is re-parented, and it kills its group and itself. We do not use ``prctl(PR_SET_PDEATHSIG)``: Linux
    sends that signal when the *thread* that spawned the child exits, not the process, and the pool spawns its
    worker from whichever thread submits first (a dispatcher thread), so it would kill healthy workers whenever
    such a thread ended. The watchdog's limit is a task holding the GIL in C code, which delays it; that is why
    the ledger must also know the worker (below) before it re-grants a dead flow's slices.

    The worker registers with the pool ledger (``ledger_path``, a shared pool's file) under the flow process's
    ``owner_key``: the ledger then keeps the flow's slices until this worker and its whole group have died too,
    so even a worker the watchdog is slow to stop never shares a GPU with the slices' next holder.
    """
    os.setsid()
    pid = os.getpid()
    os.environ[WORKER_MARK_ENV] = worker_mark(pid, process_start(pid))
    if MPS_THREADS_ENV not in environment:
        os.environ.pop(MPS_THREADS_ENV, None)
    os.environ.update(environment)
    if ledger_path != ":memory:":
        register_worker(ledger_path, owner_key)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="gpuflows-parent-watchdog", daemon=True).start()


def task_environment(flow_env: dict[str, str], key: WorkerKey) -> dict[str, str]:
    """The environment a task runs under in a worker of ``key``: the flow's, with the worker's own CUDA settings
    and mark kept (Prefect's process runner lays the flow's environment over the worker's for each task)."""
    env = {k: v for k, v in flow_env.items() if k not in (WORKER_MARK_ENV, MPS_THREADS_ENV)}
    return env | key.environment()


def _watch_parent(parent_pid: int) -> None:
    """Kill this worker's group and the worker once ``parent_pid`` is no longer its parent (also at once, if the
    flow process died while this worker was starting)."""
    while os.getppid() == parent_pid:
        time.sleep(WATCHDOG_INTERVAL_S)
    me = os.getpid()
    (members,) = group_members([(me, process_start(me))]).values()
    for pid in members:
        if pid != me:
            _kill(pid)
    os.kill(me, signal.SIGKILL)
