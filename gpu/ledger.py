"""The pool ledger: the one owner of who holds which slice of which GPU.

State lives in SQLite so that every flow run using the same pool, in any process on this
machine, shares one ledger (on a Ray cluster the same class runs inside one named actor, see
``tasks.runtime.ray_runner``); ``path=None`` keeps it in memory for one process and for simulations.

What it guarantees (``docs/architecture.md`` says how each is tested):

* **No over-commit.** Every change runs in one ``BEGIN IMMEDIATE`` transaction that ends by
  planning the whole queue (``plan_grants``) and granting what the policy grants, to whichever
  owner waits: FIFO holds across processes by construction, and what a waiter receives is the
  committed lease row, never a process-local cache.
* **No slice held by two live processes.** Where a holder's pids are visible (this host, pid namespace and
  boot: ``gpu.liveness.PID_SPACE``) its slices are freed only once the holder *and every worker process
  registered under it* are dead (``/proc``, pid + start time): a stopped (SIGSTOP) or starved holder keeps
  them, whatever its heartbeat. A heartbeat expiry frees slices only of holders whose pids are not visible
  (other hosts, containers with their own pid namespace), and those learn it on their next heartbeat
  (``watch``), each lease carrying a fencing ``generation``.
* **A wiped, replaced or rolled-back file never becomes a pool that grants held GPUs again**
  (``gpu.ledger_file``), a GPU has one ledger per machine (``gpu.claims``), and SQLite and OS failures (disk
  full, a write lock held elsewhere, a read-only folder) are ``LedgerError``s that say so.

Waiting is cheap: one watcher thread per process sleeps on its doorbell (``gpu.wakeup``), which a
transaction granting one of its tickets in another process rings after it commits (a grant to a thread of
the committing process is handed over directly), and then reads its tickets' fate (it also looks every
``SAFETY_POLL_S``, in case a ring was lost); dead holders are looked for once per ``reclaim_interval``
across all processes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
import weakref
from contextlib import closing, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from gpu.claims import claim_devices
from gpu.devices import Device, Node, PoolSpec
from gpu.errors import (
    AllocationTimeout, ConfigError, LeaseLost, LedgerBusy, LedgerBusyTimeout, LedgerError, LedgerReplaced,
)
from gpu.ledger_file import LOCK_TIMEOUT_S, LedgerFile, describe_error
from gpu.liveness import (
    HOST, PID_SPACE, Owner, live_groups, pids_visible, process_alive, process_start, process_state,
)
from gpu.wakeup import SAFETY_POLL_S, Doorbells, drain
from gpu.placement import (
    DeviceChoice, DeviceState, FifoBestFit, NodeState, PlacementPolicy, ResourceRequest, Waiting, apply_choice,
    check_ever_fits, choose_all, configured, plan_grants, waits_off_head,
)
from gpu.scenario import number, positive
from gpu.units import format_memory

log = logging.getLogger("gpuflows.ledger")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS leases (
  id TEXT PRIMARY KEY, owner TEXT, host TEXT, pid INTEGER, pstart INTEGER, label TEXT,
  node TEXT, devices TEXT, fraction REAL, memory INTEGER, cpus REAL, resources TEXT,
  granted_at REAL, expires_at REAL, generation INTEGER, ticket INTEGER);
CREATE TABLE IF NOT EXISTS tickets (
  id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT, host TEXT, pid INTEGER, pstart INTEGER,
  request TEXT, priority REAL, created_at REAL, expires_at REAL);
CREATE TABLE IF NOT EXISTS resources (node TEXT, name TEXT, capacity REAL, PRIMARY KEY (node, name));
CREATE TABLE IF NOT EXISTS workers (owner TEXT, host TEXT, pid INTEGER, pstart INTEGER, PRIMARY KEY (owner, host, pid));
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL, kind TEXT, lease_id TEXT, label TEXT,
  node TEXT, devices TEXT, fraction REAL, memory INTEGER, reason TEXT, holder TEXT);
"""
_ADDED_COLUMNS = {"leases": ("generation INTEGER", "ticket INTEGER", "backed_by TEXT", "space TEXT"),
                  "tickets": ("space TEXT", "wants TEXT"), "workers": ("space TEXT",),
                  "events": ("reason TEXT", "holder TEXT"), "resources": ("lease TEXT",)}
_INDEXES = ("CREATE INDEX IF NOT EXISTS leases_by_ticket ON leases(ticket)",
            "CREATE INDEX IF NOT EXISTS leases_by_owner ON leases(owner)",
            "CREATE INDEX IF NOT EXISTS resources_by_name ON resources(name)",
            "CREATE INDEX IF NOT EXISTS resources_by_lease ON resources(lease)",
            "CREATE INDEX IF NOT EXISTS tickets_in_order ON tickets(priority DESC, id)")  # FifoBestFit.sql_order
_SCHEMA_VERSION = hashlib.sha1(repr((_SCHEMA, _ADDED_COLUMNS, _INDEXES)).encode()).hexdigest()[:16]
_KEEP_EVENTS = 20_000
_PLAN_BATCH = 16
_Finish = Callable[[sqlite3.Connection], Any]


@dataclass(eq=False)
class _Shared:
    """One thread's piece of a shared write transaction (``PoolLedger._shared_tx``)."""

    work: Callable[[sqlite3.Connection], _Finish]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
_LEASE_COLS = "id, node, devices, fraction, memory, cpus, resources, label, granted_at, generation"
_EVENT_COLS = "t, kind, lease_id, label, node, devices, fraction, memory, holder, reason"
_EVENT_LEASE = "id, label, node, devices, fraction, memory, owner"  # a lease row as events record it
_HOLDER_COLS = "owner, host, pid, pstart, space"  # who holds a lease or waits with a ticket


_QUEUING = object()
"""A waiting ticket's outcome while the transaction queuing it has not committed (not yet visible to a look)."""

_OPEN: "weakref.WeakValueDictionary[str, PoolLedger]" = weakref.WeakValueDictionary()
"""Ledgers open in this process by ``pool_id``: a task in thread mode reaches its runner's ledger."""


def _create_schema(db: sqlite3.Connection) -> None:
    """Create the tables, adding the columns older ledgers lack, and record the schema's version."""
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    for table, columns in _ADDED_COLUMNS.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        for column in columns:
            if column.split()[0] not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    for statement in _INDEXES:
        db.execute(statement)
    db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (_SCHEMA_VERSION,))


def _schema_current(db: sqlite3.Connection) -> bool:
    """Whether the file already has this version's schema: then opening it writes nothing, and so never waits
    for the write lock (a writer stopped inside its transaction would hold a new client for SQLite's patience)."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    except sqlite3.OperationalError:  # no meta table: a new file
        return False
    return row is not None and row[0] == _SCHEMA_VERSION


@functools.lru_cache(maxsize=8192)
def _parse_request(text: str) -> ResourceRequest:
    """A ticket's request from its committed row text (keyed by content, never by ticket id)."""
    return ResourceRequest.from_dict(json.loads(text))


@functools.lru_cache(maxsize=1024)
def _names(wants: str) -> tuple[str, ...]:
    """The resource names of a ticket's ``wants`` column (a JSON list)."""
    return tuple(json.loads(wants))


@dataclass(frozen=True)
class Lease:
    """A granted slice: what the task may use and how to point CUDA at it.

    ``generation`` is the lease's fencing token: it grows with every grant of the pool, so work
    stamped with it can be told apart from work of a later holder of the same slice. ``pool`` names
    the ledger that granted it (``PoolLedger.pool_id``), so a task can reach its own pool: ESCHER's
    ``set_resource(name, capacity, None)`` means "on the caller's node" (ESCHER Listing 1).
    """

    lease_id: str
    node: str
    devices: tuple[int, ...]
    fraction: float
    memory: int
    cpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    label: str = ""
    simulated: bool = True
    granted_at: float = 0.0
    generation: int = 0
    pool: str = ""

    @property
    def cuda_visible_devices(self) -> str:
        """Value for CUDA_VISIBLE_DEVICES (NVML/PCI order; set CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
        return ",".join(str(i) for i in self.devices)

    def describe(self) -> str:
        where = ",".join(f"gpu{i}" for i in self.devices) or "cpu"
        mem = f" {format_memory(self.memory)}" if self.memory else ""
        return f"{self.label or self.lease_id[:8]} -> {self.node}:{where} x{self.fraction:g}{mem}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["devices"] = list(self.devices)
        d["resources"] = dict(self.resources)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "Lease":
        return cls(**{**d, "devices": tuple(d["devices"]), "resources": dict(d.get("resources") or {})})


class LedgerClient:
    """What every ledger client shares: blocking allocation on top of submit/try_grant/cancel (the Ray
    ledger's client polls with it), and the leases this client holds, so that one taken away by
    the ledger is reported to whoever ``watch``es it."""

    poll_interval: float = 0.2

    def __init__(self) -> None:
        self._held: dict[str, Lease] = {}
        self._watchers: dict[str, Callable[[str], None]] = {}

    def _hold(self, placement: Lease | None) -> Lease | None:
        if placement is not None:
            self._held[placement.lease_id] = placement
        return placement

    def watch(self, lease_id: str, on_lost: Callable[[str], None]) -> None:
        """Call ``on_lost(reason)`` (from the heartbeat thread) if the ledger takes ``lease_id`` away."""
        self._watchers[lease_id] = on_lost

    def _lose(self, lease_ids: list[str], reason: str) -> None:
        """Report leases this client held that the ledger no longer has."""
        for lease_id in lease_ids:
            placement = self._held.pop(lease_id, None)
            if placement is None:
                continue
            log.error("lease %s was taken from this process: %s", placement.describe(), reason)
            callback = self._watchers.pop(lease_id, None)
            if callback is not None:
                callback(reason)

    def submit(self, request: ResourceRequest, priority: float = 0.0) -> int:
        raise NotImplementedError

    def try_grant(self, ticket: int) -> Lease | None:
        raise NotImplementedError

    def cancel(self, ticket: int) -> None:
        raise NotImplementedError

    def release(self, lease_id: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the client's background work (leases stay until released or reclaimed)."""

    # -- ephemeral resources (ESCHER §4.3): what an ESCHER Scheduling Library needs of any ledger --
    def set_resource(self, name: str, capacity: float, node: str | None = None) -> None:
        """Create or resize resource ``name`` on ``node`` (None: every node); capacity 0 deletes it."""
        raise NotImplementedError

    def adjust_resource(self, name: str, delta: float, node: str | None = None) -> dict[str, float]:
        """Add ``delta`` to ``name``'s capacity in one transaction (ESCHER §4.5's delta log: two
        monitors growing the same resource never lose an update); the new capacity per node."""
        raise NotImplementedError

    def lease_resource(self, lease_id: str, name: str, capacity: float) -> None:
        """Create ``name`` on lease ``lease_id``'s node, backed by the lease: grants for it that ask for no
        GPU run on the lease's devices; it is deleted with the lease (a GPU ghost, ESCHER P4)."""
        raise NotImplementedError

    def cluster_status(self) -> dict[str, dict[str, tuple[float, float]]]:
        """node -> resource -> (capacity, available), physical ``CPU``/``GPU`` included (ESCHER's
        ``get_cluster_status``); every node of the pool is listed, with or without resources."""
        raise NotImplementedError

    def free_state(self) -> list[NodeState]:
        """What is free on every node now."""
        raise NotImplementedError

    def delete_resource(self, name: str, node: str | None = None) -> None:
        """``set_resource(name, 0, node)``."""
        self.set_resource(name, 0, node)

    def submit_and_try(self, request: ResourceRequest, priority: float = 0.0) -> tuple[int, Lease | None]:
        """``submit`` then a first ``try_grant``; ledgers override it to do both in one step."""
        ticket = self.submit(request, priority)
        try:
            return ticket, self.try_grant(ticket)
        except BaseException:
            self.cancel(ticket)
            raise

    def allocate(self, request: ResourceRequest, timeout: float | None = None,
                 cancel_event: threading.Event | None = None, priority: float = 0.0) -> Lease:
        """Wait (FIFO by default) until ``request`` is granted; raise AllocationTimeout after ``timeout``
        seconds, or InterruptedError when ``cancel_event`` is set. Never-fitting requests raise at once."""
        ticket, placement = self.submit_and_try(request, priority)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        try:
            while placement is None:
                raise_if_wait_over(request, timeout, deadline, cancel_event)
                wait = min(delay, self.poll_interval)
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                (cancel_event or threading.Event()).wait(wait)
                delay *= 2
                placement = self.try_grant(ticket)
            return placement
        except BaseException:
            self.cancel(ticket)
            raise

    @contextmanager
    def lease(self, request: ResourceRequest, timeout: float | None = None) -> Iterator[Lease]:
        """``with ledger.lease(ResourceRequest(gpus=0.5)) as p:`` releases on exit, also after an exception."""
        placement = self.allocate(request, timeout)
        try:
            yield placement
        finally:
            self.release(placement.lease_id)


def raise_if_wait_over(request: ResourceRequest, timeout: float | None, deadline: float | None,
                   cancel_event: threading.Event | None) -> None:
    """End a wait for ``request``: cancelled, or past its deadline (every ledger client's ``allocate`` loop)."""
    if cancel_event is not None and cancel_event.is_set():
        raise InterruptedError(f"request {request.describe()} was cancelled while waiting")
    if deadline is not None and time.monotonic() >= deadline:
        raise AllocationTimeout(f"request {request.describe()} got no placement within {timeout}s")


class PoolLedger(LedgerClient):
    """SQLite-backed ledger of one pool, shared by every process that opens the same ``path``."""

    def __init__(self, spec: PoolSpec, path: str | os.PathLike | None = None, policy: PlacementPolicy | None = None,
                 lease_ttl: float = 30.0, heartbeat: bool = True, reclaim_interval: float = 0.25):
        positive(lease_ttl, "lease_ttl")  # finite too: the heartbeat sleeps a third of it
        positive(reclaim_interval, "reclaim_interval")
        self.spec = spec
        self.policy: PlacementPolicy = policy or FifoBestFit()
        self.lease_ttl = lease_ttl
        self.reclaim_interval = reclaim_interval
        self.lock_timeout = LOCK_TIMEOUT_S
        self.owner = Owner.this_process()
        self._file = LedgerFile(os.path.abspath(path)) if path else None
        self.path = self._file.path if self._file else ":memory:"
        self.pool_id = str(self.path) if self._file else f"memory:{uuid.uuid4().hex}"
        _OPEN[self.pool_id] = self
        self._lock = threading.RLock()          # the in-memory connection; waiters' bookkeeping
        self._cv = threading.Condition(self._lock)
        self._idle: list[sqlite3.Connection] = []  # a file's connections not in use right now
        self._writer = threading.Lock()           # one write transaction per process at a time (_writing)
        self._pending_lock = threading.Lock()
        self._pending: list[_Shared] = []         # work queued for the next shared transaction
        self._granted_to = threading.local()      # what a transaction granted: owners to ring, this process's leases
        if self._file:
            claim_devices([d.uuid for n in spec.nodes for d in n.devices if not d.simulated], self.path)
            self._idle.append(self._file.open(_create_schema, _schema_current))
            self._bells: Doorbells | None = Doorbells(self._file.pool_id)
        else:
            self._memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            _create_schema(self._memory)
            self._bells = None
        self._capacity = [NodeState(n.name, tuple(DeviceState(d.index, d.memory_total, uuid=d.uuid) for d in n.devices),
                                    n.cpus, n.cpus) for n in spec.nodes]
        super().__init__()
        self._outcomes: dict[int, Lease | BaseException | object | None] = {}  # this process's waiting tickets
        self._watch_idle = False                  # the watcher sleeps long: nothing of this process waits
        self._abandoned: set[int] = set()
        self._poked = False
        self._closed = threading.Event()
        self._want_heartbeat = heartbeat
        self._threads: list[threading.Thread] = []
        with self._conn() as db:
            stored = db.execute("SELECT value FROM meta WHERE key='spec'").fetchone()
        if stored is None or stored[0] != self._spec_text():
            with self._tx("store the pool's layout") as db:
                self._sync_spec(db)

    @property
    def capacity(self) -> list[NodeState]:
        """The pool's capacity when empty (used to reject never-fitting requests up front)."""
        return self._capacity

    # -- plumbing -------------------------------------------------------------------------
    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        """A connection for one call. On a file each thread in a call has its own (threads then wait
        only on SQLite's lock, and a heartbeat never waits behind a request); in memory the one
        connection, under the lock."""
        if self._file is None:
            with self._lock:
                yield self._memory
            return
        try:
            db = self._idle.pop()
        except IndexError:
            db = self._file.connect()
        try:
            yield db
        finally:
            if self._closed.is_set():
                db.close()
            else:
                self._idle.append(db)

    @contextmanager
    def _tx(self, action: str, busy: float | None = None, turn_held: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction; SQLite failures become LedgerErrors naming the file and ``action``.

        It waits for another process's write lock at most ``lock_timeout`` seconds, or ``busy`` when that
        is shorter (then LedgerBusy). ``turn_held``: the caller already holds this process's write turn.
        Owners granted something in the transaction are rung once it committed.
        """
        patience = self._patience(busy)
        deadline = time.monotonic() + patience
        with self._conn() as db, (nullcontext() if turn_held else self._writing(action, patience)):
            self._begin(db, action, max(0.0, deadline - time.monotonic()))
            self._granted_to.owners = granted = set()
            self._granted_to.mine = mine = {}
            stamped = None
            try:
                epoch = self._file.verify(db) if self._file else None
                changes = db.total_changes
                yield db
                if epoch is not None and db.total_changes != changes:
                    stamped = self._file.stamp(db, epoch)
                db.execute("COMMIT")
            except BaseException as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise describe_error(exc, self.path, action) from exc
                raise
            if stamped is not None:
                self._file.committed(stamped)
        if mine:
            self._deliver(mine)
        if granted:
            self._ring(granted - {self.owner.key})

    def _patience(self, busy: float | None) -> float:
        """How long a call waits for the write lock: ``busy`` (0: one try) up to ``lock_timeout``."""
        return self.lock_timeout if busy is None else min(self.lock_timeout, max(0.0, busy))

    @contextmanager
    def _writing(self, action: str, patience: float) -> Iterator[None]:
        """This process's turn to write: one thread at a time asks SQLite for the write lock.

        Threads of one process queue on a mutex (woken at once when it frees) instead of all polling
        SQLite's lock with back-off sleeps: with 16 task threads the polling cost ~20 ms a transaction.
        The in-memory ledger is already serialised by ``_conn``.
        """
        if self._file is None:
            yield
            return
        if not self._writer.acquire(timeout=patience):
            raise LedgerBusy(f"pool ledger {self.path}: could not {action}: this process's other threads held "
                             f"its write turn for longer than {patience:g} s; nothing was changed")
        try:
            yield
        finally:
            self._writer.release()

    def _shared_tx(self, action: str, busy: float | None, work: Callable[[sqlite3.Connection], _Finish]) -> Any:
        """Run ``work`` in a write transaction shared with what this process's other threads queued
        meanwhile (group commit), then plan the queue once for all of them.

        ``work(db)`` makes its changes and returns ``finish(db)``, called after the plan, whose result
        ``_shared_tx`` returns. Whichever thread gets the write turn runs every queued piece in one
        transaction; the others find theirs done. Under load a grant or release then costs a share of
        one transaction instead of a transaction each: every SQLite call gives up the GIL, and with
        many task threads each handback can wait out Python's 5 ms switch interval. A failed
        transaction fails every piece in it (nothing of any of them was written).
        """
        if self._file is None:
            with self._tx(action, busy) as db:
                finish = work(db)
                self._plan(db)
                return finish(db)
        mine = _Shared(work)
        with self._pending_lock:
            self._pending.append(mine)
        patience = self._patience(busy)
        deadline = time.monotonic() + patience
        if self._writer.acquire(timeout=patience):
            try:
                if not mine.done.is_set():
                    with self._pending_lock:
                        batch, self._pending = self._pending, []
                    self._run_shared(action, max(0.0, deadline - time.monotonic()), batch)
            finally:
                self._writer.release()
        else:
            with self._pending_lock:
                queued = mine in self._pending
                if queued:
                    self._pending.remove(mine)
            if queued:
                raise LedgerBusy(f"pool ledger {self.path}: could not {action}: this process's other threads "
                                 f"held its write turn for longer than {patience:g} s; nothing was changed")
            mine.done.wait()  # another thread's transaction has it: its outcome is ours
        if mine.error is not None:
            raise mine.error
        return mine.result

    def _run_shared(self, action: str, patience: float, batch: list[_Shared]) -> None:
        try:
            with self._tx(action, patience, turn_held=True) as db:
                finishes = [piece.work(db) for piece in batch]
                self._plan(db)
                for piece, finish in zip(batch, finishes):
                    piece.result = finish(db)
        except Exception as exc:
            for piece in batch:
                piece.error = exc
        except BaseException as exc:  # an interrupt of this thread: the others' work was not written
            for piece in batch:
                piece.error = exc if piece is batch[-1] else LedgerError(
                    f"pool ledger {self.path}: could not {action}: the shared transaction was interrupted ({exc!r})")
            raise
        finally:
            for piece in batch:
                piece.done.set()

    def _begin(self, db: sqlite3.Connection, action: str, patience: float) -> None:
        """Take the write lock, waiting for another process's at most ``patience`` seconds.

        The wait is ours, not SQLite's busy handler: that one sleeps up to 100 ms at a time and counts
        only its sleeps, so a waiter could overrun its deadline by much more under load.
        """
        deadline, delay = time.monotonic() + patience, 0.0005
        db.execute("PRAGMA busy_timeout=0")
        try:
            while True:
                try:
                    db.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    text = str(exc)
                    if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                        raise describe_error(exc, self.path, action) from exc
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(2 * delay, 0.01)
        finally:  # other statements (a reader during WAL recovery) keep SQLite's own patience
            db.execute(f"PRAGMA busy_timeout={int(1000 * self.lock_timeout)}")

    def _ring(self, owner_keys: set[str]) -> None:
        """Wake the watchers of ``owner_keys`` (this process's too)."""
        if self._bells is not None:
            self._bells.ring(owner_keys)
        elif self.owner.key in owner_keys:
            with self._cv:
                self._poked = True
                self._cv.notify_all()

    def _spec_text(self) -> str:
        """The pool's layout as the ledger stores it (``open_ledger`` and ``gpu.pool.read_pool`` read it back)."""
        return json.dumps([[n.name, n.cpus, [[d.index, d.memory_total] for d in n.devices]] for n in self.spec.nodes])

    def _sync_spec(self, db: sqlite3.Connection) -> None:
        """Store this client's layout; a different stored one is replaced only while no lease holds it."""
        wanted = self._spec_text()
        row = db.execute("SELECT value FROM meta WHERE key='spec'").fetchone()
        if row and row[0] != wanted:
            self._reclaim(db, force=True)
            if db.execute("SELECT COUNT(*) FROM leases").fetchone()[0]:
                raise ConfigError("pool", self.path, "is in use by leases on a different device set; release them first")
            names = [n.name for n in self.spec.nodes]  # a node that left takes its ephemeral resources (ESCHER §4.3)
            db.execute(f"DELETE FROM resources WHERE node NOT IN ({','.join('?' * len(names))})", names)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('spec', ?)", (wanted,))

    def _start_threads(self) -> None:
        """Heartbeat and watcher threads, started with the first request."""
        if self._threads or self._closed.is_set():
            return
        with self._lock:
            if self._threads:
                return
            loops = [self._watch_loop] + ([self._heartbeat_loop] if self._want_heartbeat else [])
            self._threads = [threading.Thread(target=f, daemon=True, name=f"gpuflows-ledger{f.__name__}") for f in loops]
            for t in self._threads:
                t.start()

    def close(self) -> None:
        """Stop the background threads and drop the file lock (leases stay until released or reclaimed)."""
        self._closed.set()
        self._ring({self.owner.key})
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        if self._file:
            while self._idle:
                self._idle.pop().close()
            self._file.close()
            self._bells.close()
        else:
            with self._lock:
                self._memory.close()

    def _owner_row(self, owner: Owner | None) -> tuple:
        o = owner or self.owner
        return o.key, o.host, o.pid, o.pstart, o.space

    def _placement(self, row) -> Lease:
        return Lease(row[0], row[1], tuple(json.loads(row[2])), row[3], row[4], row[5], json.loads(row[6]),
                         row[7], self.spec.simulated, row[8], row[9] or 0, self.pool_id)

    def _event(self, db: sqlite3.Connection, kind: str, lease_row, reason: str = "") -> None:
        """Log ``kind`` for a lease row (``_EVENT_LEASE``: id, label, node, devices, fraction, memory, holder)."""
        cur = db.execute(f"INSERT INTO events ({_EVENT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                         (time.time(), kind, *lease_row, reason))
        if cur.lastrowid % 1000 == 0:
            db.execute("DELETE FROM events WHERE id <= ?", (cur.lastrowid - _KEEP_EVENTS,))

    # -- the state of the pool ----------------------------------------------------------------
    def _free_state(self, db: sqlite3.Connection, names: set[str] | None = None) -> list[NodeState]:
        """What is free per node; with ``names``, only those ephemeral resources (a grant reads the rows
        its requests name, not every resource of the pool: ESCHER Fig. 4.8b/c, scheduling cost that does
        not grow with the resources present)."""
        used_c: dict[tuple[str, int], float] = {}
        used_m: dict[tuple[str, int], int] = {}
        used_cpu: dict[str, float] = {}
        used_res: dict[tuple[str, str], float] = {}
        # Summed per distinct (node, devices, resources) in SQLite: Python sees a few groups, not every lease.
        # A lease on a ghost's devices (``backed_by``) uses the ghost's share: its devices are not counted twice.
        for node, devices, res, fraction, memory, cpus, count, backed in db.execute(
                "SELECT node, devices, resources, SUM(fraction), SUM(memory), SUM(cpus), COUNT(*), "
                "backed_by IS NOT NULL AS backed FROM leases GROUP BY node, devices, resources, backed"):
            for i in [] if backed else json.loads(devices):
                used_c[(node, i)] = used_c.get((node, i), 0.0) + fraction
                used_m[(node, i)] = used_m.get((node, i), 0) + memory
            used_cpu[node] = used_cpu.get(node, 0.0) + cpus
            for k, v in json.loads(res).items():
                used_res[(node, k)] = used_res.get((node, k), 0.0) + v * count
        caps: dict[str, dict[str, float]] = {}
        if names is None:
            rows = db.execute("SELECT node, name, capacity FROM resources")
        else:
            wanted = sorted(names)
            rows = [r for i in range(0, len(wanted), 500) for r in db.execute(
                f"SELECT node, name, capacity FROM resources WHERE name IN ({','.join('?' * len(wanted[i:i + 500]))})",
                wanted[i:i + 500])]
        for node, name, cap in rows:
            caps.setdefault(node, {})[name] = cap
        out = []
        for n in self._capacity:
            devices = tuple(DeviceState(d.index, d.memory_total, 1.0 - used_c.get((n.name, d.index), 0.0),
                                        d.memory_total - used_m.get((n.name, d.index), 0), d.uuid) for d in n.devices)
            res = {k: cap - used_res.get((n.name, k), 0.0) for k, cap in caps.get(n.name, {}).items()}
            out.append(NodeState(n.name, devices, n.cpus_total, n.cpus_total - used_cpu.get(n.name, 0.0), res,
                                 caps.get(n.name, {})))
        return out

    def _plan(self, db: sqlite3.Connection) -> None:
        """Grant every waiting ticket the policy grants now, whoever waits for it, in the policy's order.

        A policy that states its order as SQL (``sql_order``) and does not backfill is planned a few
        tickets at a time, stopping at its first misfit: the transaction, which every process waits
        on, then costs the same with 10 or 1,000 tickets queued.
        """
        columns = "id, request, priority, owner"
        order = None if self.policy.backfill else getattr(self.policy, "sql_order", None)
        if order is None:
            batches: Iterator[list] = iter([db.execute(f"SELECT {columns} FROM tickets").fetchall()])
        else:
            cursor = db.execute(f"SELECT {columns} FROM tickets ORDER BY {order}")
            batches = iter(lambda: cursor.fetchmany(_PLAN_BATCH), [])
        nodes: list[NodeState] | None = None
        chosen: list[tuple[Waiting, DeviceChoice, str]] = []
        for rows in batches:
            if not rows:
                break
            if nodes is None:
                nodes = self._free_state(db, self._requested_names(db))
                as_configured = configured(nodes)
            waiting = [Waiting(r[0], _parse_request(r[1]), r[2]) for r in rows]
            grants = plan_grants(self.policy, waiting, nodes)
            for w, r in zip(waiting, rows):
                if w.ticket in grants:
                    chosen.append((w, grants[w.ticket], r[3]))
                    nodes = apply_choice(nodes, w.request, grants[w.ticket])
                elif order is not None and not waits_off_head(w.request, as_configured):
                    break  # the first misfit: nothing after it is granted
            else:
                continue
            break
        if chosen:
            self._grant(db, chosen)

    @staticmethod
    def _requested_names(db: sqlite3.Connection) -> set[str]:
        """The ephemeral resources any waiting ticket asks for (all a plan can need to read), from each ticket's
        ``wants``: distinct per set of names, not per ticket (each request text is, with its label), so a long
        queue costs a plan one scan in SQLite, not a parse per ticket. A ticket queued without ``wants`` (by an
        older client) is read from its request."""
        names: set[str] = set()
        for wants, text in db.execute("SELECT DISTINCT wants, CASE WHEN wants IS NULL THEN request END FROM tickets"):
            names.update(_names(wants) if wants is not None else _parse_request(text).resources)
        return names

    def _grant(self, db: sqlite3.Connection, chosen: list[tuple[Waiting, DeviceChoice, str]]) -> None:
        """Turn planned tickets into leases of their owners, each with the next fencing generation."""
        row = db.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
        generation = int(row[0]) if row else 0
        now = time.time()
        for w, choice, owner in chosen:
            generation += 1
            holder = db.execute(f"SELECT {_HOLDER_COLS} FROM tickets WHERE id=?", (w.ticket,)).fetchone()
            backer = self._backer(db, w.request, choice.node)
            devices, fraction, memory = backer[1:] if backer else (json.dumps(list(choice.devices)), choice.fraction,
                                                                   choice.memory)
            lease = (uuid.uuid4().hex, choice.node, devices, fraction, memory, w.request.cpus,
                     json.dumps(dict(w.request.resources)), w.request.label, now, generation)  # as _LEASE_COLS
            db.execute(f"INSERT INTO leases ({_LEASE_COLS}, {_HOLDER_COLS}, expires_at, ticket, backed_by) "
                       "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (*lease, *holder, now + self.lease_ttl, w.ticket, backer[0] if backer else None))
            db.execute("DELETE FROM tickets WHERE id=?", (w.ticket,))
            self._granted_to.owners.add(owner)
            if owner == self.owner.key:  # delivered by the committing thread, no watcher round trip
                self._granted_to.mine[w.ticket] = self._placement(lease)
            self._event(db, "allocate", (lease[0], w.request.label, choice.node, devices, fraction, memory, owner))
        db.execute("INSERT OR REPLACE INTO meta VALUES ('generation', ?)", (str(generation),))

    @staticmethod
    def _backer(db: sqlite3.Connection, request: ResourceRequest, node: str) -> tuple | None:
        """The ghost lease (id, devices, fraction, memory) behind a lease-backed resource ``request`` names
        on ``node``, for a request of no GPU of its own: its grant runs on the ghost's devices."""
        if request.uses_gpu or not request.resources:
            return None
        names = sorted(request.resources)
        return db.execute(
            "SELECT l.id, l.devices, l.fraction, l.memory FROM resources r JOIN leases l ON l.id = r.lease "
            f"WHERE r.node=? AND r.name IN ({','.join('?' * len(names))}) LIMIT 1", (node, *names)).fetchone()

    @staticmethod
    def _delete_lease(db: sqlite3.Connection, lease_id: str) -> None:
        """Drop a lease, and the resources it backs with it."""
        db.execute("DELETE FROM leases WHERE id=?", (lease_id,))
        db.execute("DELETE FROM resources WHERE lease=?", (lease_id,))

    def _granted(self, db: sqlite3.Connection, ticket: int) -> Lease | None:
        row = db.execute(f"SELECT {_LEASE_COLS} FROM leases WHERE ticket=?", (ticket,)).fetchone()
        return self._placement(row) if row else None

    def _reclaim(self, db: sqlite3.Connection, force: bool = False) -> int:
        """Free what dead holders hold (at most once per ``reclaim_interval`` across processes unless ``force``).

        A holder whose pids we see (this host, this pid namespace and boot: ``pids_visible``) is dead when
        its process and every worker registered under it are gone; any other (another host, a container's
        pid namespace) when its heartbeat expired. Tickets of dead holders go too.
        """
        now = time.time()
        if not force and not self._due(db, now):
            return 0
        db.execute("INSERT OR REPLACE INTO meta VALUES ('last_reclaim', ?)", (repr(now),))
        workers = self._live_workers(db)
        dead: dict[str, str] = {}
        for owner, host, pid, pstart, space, expires in db.execute(
                f"SELECT {_HOLDER_COLS}, MIN(expires_at) FROM (SELECT {_HOLDER_COLS}, expires_at FROM leases "
                f"UNION ALL SELECT {_HOLDER_COLS}, expires_at FROM tickets) GROUP BY owner").fetchall():
            if pids_visible(host, space):
                if not process_alive(pid, pstart) and owner not in workers:
                    dead[owner] = f"its holder (pid {pid}) died"
            elif expires < now:
                dead[owner] = (f"its holder ({_where(host, space, pid)}) sent no heartbeat "
                               f"for {self.lease_ttl:g} s")
        freed = 0
        for owner, reason in dead.items():
            for r in db.execute(f"SELECT {_EVENT_LEASE} FROM leases WHERE owner=?",
                                (owner,)).fetchall():
                self._delete_lease(db, r[0])
                self._event(db, "reclaim", r, reason)
                freed += 1
            db.execute("DELETE FROM tickets WHERE owner=?", (owner,))
            db.execute("DELETE FROM workers WHERE owner=?", (owner,))
        if dead:
            self._plan(db)
        return freed

    @staticmethod
    def _live_workers(db: sqlite3.Connection) -> set[str]:
        """Owners with a registered worker group still alive here (``gpu.liveness.group_members``: the worker
        or anything it started); rows of dead groups are deleted. A live worker costs one ``/proc`` read; only
        dead ones are looked for among all processes, in one pass."""
        alive: set[str] = set()
        gone: list[tuple[str, str, int, int]] = []
        for owner, host, pid, pstart, space in db.execute(f"SELECT {_HOLDER_COLS} FROM workers").fetchall():
            if not pids_visible(host, space):
                continue
            if process_alive(pid, pstart):
                alive.add(owner)
            else:
                gone.append((owner, host, pid, pstart))
        groups = live_groups((pid, pstart) for _, _, pid, pstart in gone) if gone else set()
        for owner, host, pid, pstart in gone:
            if (pid, pstart) in groups:
                alive.add(owner)
            else:
                db.execute("DELETE FROM workers WHERE owner=? AND host=? AND pid=?", (owner, host, pid))
        return alive

    # -- requests ---------------------------------------------------------------------------
    def _check(self, request: ResourceRequest) -> None:
        if request.node is not None and request.node not in {n.name for n in self._capacity}:
            raise ConfigError("node", request.node, f"not in this pool (nodes: {[n.name for n in self._capacity]})")
        check_ever_fits(request, self._capacity)

    def _insert_ticket(self, db: sqlite3.Connection, request: ResourceRequest, priority: float, owner: Owner | None) -> int:
        now = time.time()
        cur = db.execute("INSERT INTO tickets (owner, host, pid, pstart, space, request, wants, priority, created_at, "
                         "expires_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                         (*self._owner_row(owner), json.dumps(request.to_dict()), json.dumps(sorted(request.resources)),
                          priority, now, now + self.lease_ttl))
        return int(cur.lastrowid)

    def submit(self, request: ResourceRequest, priority: float = 0.0, owner: Owner | None = None) -> int:
        """Queue ``request`` (granted as soon as the policy places it); NeverFitsError if it never can."""
        return self.submit_and_try(request, priority, owner)[0]

    def submit_and_try(self, request: ResourceRequest, priority: float = 0.0, owner: Owner | None = None,
                       busy: float | None = None, awaiting: list[int] | None = None) -> tuple[int, Lease | None]:
        """Queue ``request`` and plan the queue in one transaction (most requests fit at once).

        ``awaiting``: the caller will wait for the ticket (``allocate``), which is registered, and appended to
        the list, before the transaction commits, so that no grant after the commit can miss its waiter.
        """
        self._check(request)
        self._start_threads()
        def work(db: sqlite3.Connection) -> _Finish:
            ticket = self._insert_ticket(db, request, priority, owner)
            if awaiting is not None:
                with self._cv:
                    self._outcomes[ticket] = _QUEUING
                awaiting.append(ticket)

            def finish(db: sqlite3.Connection) -> tuple[int, Lease | None]:
                placement = self._granted(db, ticket)
                if placement is None and self._reclaim(db):
                    placement = self._granted(db, ticket)
                return ticket, placement
            return finish

        ticket, placement = self._shared_tx("queue a request", busy, work)
        return ticket, placement if owner else self._hold(placement)

    def grant_all(self, requests: Sequence[ResourceRequest], owner: Owner | None = None) -> list[Lease] | None:
        """Grant every one of ``requests`` in one transaction, or none of them (None): an all-or-none gang
        grant, the analogue of ESCHER's FrameSpace gang scheduling (§4.4e) and of a Ray placement group.
        It does not queue: the caller retries when the pool changes. Requests already waiting keep their
        order among themselves; a gang that fits now may go before them, as a backfilled request would."""
        if not requests:
            raise ConfigError("requests", requests, "a gang of 0 requests has nothing to grant")
        for request in requests:
            self._check(request)
        self._start_threads()
        with self._tx("grant a gang") as db:
            choices = choose_all(self.policy, requests, self._free_state(db, {k for r in requests for k in r.resources}))
            if choices is None:
                return None
            key = (owner or self.owner).key
            tickets = [self._insert_ticket(db, r, 0.0, owner) for r in requests]
            self._grant(db, [(Waiting(t, r), c, key) for t, r, c in zip(tickets, requests, choices)])
            placements = [self._granted(db, t) for t in tickets]
        return placements if owner else [self._hold(p) for p in placements]

    def try_grant(self, ticket: int, owner: Owner | None = None) -> Lease | None:
        """The lease ``ticket`` was granted, or None while it waits (looking for dead holders if due)."""
        with self._tx("check a request") as db:
            placement = self._granted(db, ticket)
            if placement is None:
                if db.execute("SELECT 1 FROM tickets WHERE id=?", (ticket,)).fetchone() is None:
                    raise KeyError(f"ticket {ticket} is not waiting (cancelled, expired or already granted)")
                if self._reclaim(db):
                    placement = self._granted(db, ticket)
        return placement if owner else self._hold(placement)

    def allocate(self, request: ResourceRequest, timeout: float | None = None,
                 cancel_event: threading.Event | None = None, priority: float = 0.0) -> Lease:
        """Wait (FIFO by default) until ``request`` is granted; AllocationTimeout after ``timeout`` s,
        InterruptedError once ``cancel_event`` is set; a never-fitting request raises at once.

        The waiting thread only sleeps: this process's watcher thread learns the ticket's fate.
        A ticket given up (timeout, cancel) is withdrawn by the watcher, so the timeout is kept
        even while another process holds the ledger's write lock.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        awaiting: list[int] = []
        try:
            ticket, placement = self.submit_and_try(request, priority, busy=timeout, awaiting=awaiting)
        except BaseException as exc:
            with self._cv:
                for t in awaiting:  # its transaction failed: nothing was queued
                    self._outcomes.pop(t, None)
            if isinstance(exc, LedgerBusy):
                raise LedgerBusyTimeout(f"request {request.describe()} got no placement within {timeout}s: "
                                        f"{exc}") from exc
            raise
        with self._cv:
            if placement is not None:
                self._outcomes.pop(ticket, None)
                return placement
            if self._outcomes.get(ticket) is _QUEUING:
                self._outcomes[ticket] = None
            if self._watch_idle:  # it sleeps long when nothing waits: its reclaim checks must start now
                self._wake_watcher()
            try:
                while True:
                    outcome = self._outcomes[ticket]
                    if isinstance(outcome, Lease):
                        return self._hold(outcome)
                    if isinstance(outcome, BaseException):
                        raise outcome
                    raise_if_wait_over(request, timeout, deadline, cancel_event)
                    wait = 0.05 if cancel_event is not None else 1.0
                    if deadline is not None:
                        wait = min(wait, max(0.0, deadline - time.monotonic()))
                    self._cv.wait(wait)
            except BaseException:
                self._abandoned.add(ticket)
                self._wake_watcher()
                raise
            finally:
                self._outcomes.pop(ticket, None)

    def cancel(self, ticket: int) -> None:
        """Withdraw ``ticket``; if it was granted meanwhile and not taken up, release that lease."""
        with self._tx("withdraw a request") as db:
            db.execute("DELETE FROM tickets WHERE id=?", (ticket,))
            row = db.execute(f"SELECT {_EVENT_LEASE} FROM leases WHERE ticket=?",
                             (ticket,)).fetchone()
            if row is not None and row[0] not in self._held:
                self._delete_lease(db, row[0])
                self._event(db, "release", row, "request withdrawn")
            self._plan(db)

    def release(self, lease_id: str, linger: Sequence[tuple[int, int]] = ()) -> bool:
        """Return a lease's slice to the pool; False if it was no longer held (reclaimed or released).

        ``linger``: processes of this pid space (pid, start time) that may still run on the slice after its
        task ended (what a task left running, its dead worker's survivors). While one of them, or anything
        in a session it leads, lives the lease stays, held by them as a worker group is
        (``register_worker``), and the reclaim frees it once they are all dead: this process's heartbeat
        no longer matters to it.
        """
        held = self._held.pop(lease_id, None)
        try:
            def work(db: sqlite3.Connection) -> _Finish:
                row = db.execute(f"SELECT {_EVENT_LEASE} FROM leases WHERE id=?", (lease_id,)).fetchone()
                survivors = [p for p in linger if process_alive(*p)] if row is not None else []
                if survivors:
                    pid, pstart = survivors[0]
                    key = f"{HOST}:{pid}:linger-{lease_id[:8]}"
                    db.execute("UPDATE leases SET owner=?, host=?, pid=?, pstart=?, space=? WHERE id=?",
                               (key, HOST, pid, pstart, PID_SPACE, lease_id))
                    db.executemany(f"INSERT OR REPLACE INTO workers ({_HOLDER_COLS}) VALUES (?,?,?,?,?)",
                                   [(key, HOST, p, start, PID_SPACE) for p, start in survivors])
                elif row is not None:
                    self._delete_lease(db, lease_id)
                    self._event(db, "release", row)
                return lambda db: row is not None

            released = self._shared_tx("release a lease", None, work)
        except BaseException:
            if held is not None:
                self._held[lease_id] = held  # still ours: the caller may retry
            raise
        self._watchers.pop(lease_id, None)
        return released

    def heartbeat(self, owner: Owner | None = None) -> set[str]:
        """Extend the expiry of everything ``owner`` holds or waits for; the lease ids it still holds."""
        return self._renew(owner)

    def _renew(self, owner: Owner | None = None) -> set[str]:
        key = (owner or self.owner).key
        with self._tx("renew leases") as tx:
            expires = time.time() + self.lease_ttl
            tx.execute("UPDATE leases SET expires_at=? WHERE owner=?", (expires, key))
            tx.execute("UPDATE tickets SET expires_at=? WHERE owner=?", (expires, key))
            return {r[0] for r in tx.execute("SELECT id FROM leases WHERE owner=?", (key,))}

    def check(self, placement: Lease) -> None:
        """Raise LeaseLost unless this exact lease (id and generation) is still held: a fencing check."""
        with self._tx("check a lease") as db:
            row = db.execute("SELECT generation FROM leases WHERE id=?", (placement.lease_id,)).fetchone()
        if row is None or (row[0] or 0) != placement.generation:
            raise LeaseLost(f"lease {placement.describe()} (generation {placement.generation}) is no longer held: "
                            f"{self._loss_reason(placement.lease_id)}")

    def _loss_reason(self, lease_id: str) -> str:
        with self._conn() as db:
            row = db.execute("SELECT reason, t FROM events WHERE lease_id=? AND kind='reclaim'", (lease_id,)).fetchone()
        if row is None:
            return "it is no longer in the ledger"
        return f"reclaimed at {time.strftime('%H:%M:%S', time.localtime(row[1]))}: {row[0]}"

    # -- background threads ---------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        """Renew this process's leases (on a connection no request waits on) and notice the ones taken away."""
        failing = False
        while not self._closed.wait(self.lease_ttl / 3):
            held = list(self._held)
            try:
                alive = self._renew()
            except LedgerReplaced as exc:
                self._lose(held, str(exc))
                continue
            except LedgerError as exc:
                if not failing:
                    log.warning("pool %s: heartbeat failed, retrying: %s", self.path, exc)
                failing = True
                continue
            failing = False
            for lease_id in held:
                if lease_id not in alive and lease_id in self._held:
                    self._lose([lease_id], self._loss_reason(lease_id))

    def _wake_watcher(self) -> None:
        self._ring({self.owner.key})
        with self._cv:
            self._poked = True
            self._cv.notify_all()

    def _watch_loop(self) -> None:
        """Learn the fate of this process's waiting tickets; withdraw the abandoned ones.

        It sleeps on this process's doorbell (a file-backed pool) or the condition (in memory), and
        looks at the ledger when rung, every ``SAFETY_POLL_S`` anyway, and for dead holders every
        ``reclaim_interval`` while something waits.
        """
        bell = self._bells.listen(self.owner.key) if self._bells else None
        next_reclaim = next_look = 0.0
        while not self._closed.is_set():
            with self._cv:
                waiting = [t for t, o in self._outcomes.items() if o is None or o is _QUEUING]
                abandoned = list(self._abandoned)
                poked, self._poked = self._poked, False
                self._watch_idle = not (waiting or abandoned)
            now = time.monotonic()
            try:
                for ticket in abandoned:
                    self.cancel(ticket)
                    self._abandoned.discard(ticket)
                if waiting and now >= next_reclaim:
                    next_reclaim = now + self.reclaim_interval
                    if self._reclaim_due():
                        with self._tx("free the slices of dead holders") as tx:
                            self._reclaim(tx)
                if waiting and (poked or now >= next_look):
                    next_look = now + SAFETY_POLL_S
                    self._collect(waiting)
            except LedgerReplaced as exc:
                self._deliver({t: exc for t in waiting})
            except LedgerError as exc:
                log.warning("pool %s: waiting for a grant: %s", self.path, exc)
            sleep = min(self.reclaim_interval, SAFETY_POLL_S) if waiting or abandoned else 1.0
            if bell is not None:
                rung = drain(bell, sleep)
            else:
                with self._cv:
                    if not self._poked:
                        self._cv.wait(sleep)
                    rung = self._poked
            if rung:
                with self._cv:
                    self._poked = True
        if bell is not None:
            bell.close()

    def _reclaim_due(self) -> bool:
        with self._conn() as db:
            return self._due(db, time.time())

    def _due(self, db: sqlite3.Connection, now: float) -> bool:
        """Whether the pool's last reclaim, by any process, was ``reclaim_interval`` or more ago.

        The stamp is another process's wall clock: one stamped in our future (that client's clock was
        stepped ahead, or ours back) is due too, or a clock an hour ahead would stop reclaim for an hour.
        A step thus costs an extra reclaim pass, never a later one.
        """
        row = db.execute("SELECT value FROM meta WHERE key='last_reclaim'").fetchone()
        return row is None or not 0.0 <= now - float(row[0]) < self.reclaim_interval

    def _collect(self, waiting: list[int]) -> None:
        """Read, in one snapshot, which of ``waiting`` were granted or dropped (a ticket whose queuing has not
        committed yet is neither)."""
        marks = ",".join("?" * len(waiting))
        with self._cv:  # before the snapshot: one committed after it is in it
            committed = [t for t in waiting if self._outcomes.get(t) is not _QUEUING]
        with self._conn() as db:
            db.execute("BEGIN")
            try:
                granted = db.execute(f"SELECT ticket, {_LEASE_COLS} FROM leases WHERE ticket IN ({marks})",
                                     waiting).fetchall()
                queued = {r[0] for r in db.execute(f"SELECT id FROM tickets WHERE id IN ({marks})", waiting)}
            finally:
                db.execute("COMMIT")
        outcomes: dict[int, Lease | BaseException] = {r[0]: self._placement(r[1:]) for r in granted}
        for ticket in committed:
            if ticket not in outcomes and ticket not in queued:
                outcomes[ticket] = LedgerError(f"pool {self.path}: request ticket {ticket} was dropped from the queue "
                                               "(this process looked dead or stopped heartbeating)")
        self._deliver(outcomes)

    def _deliver(self, outcomes: Mapping[int, Lease | BaseException]) -> None:
        with self._cv:
            for ticket, outcome in outcomes.items():
                if ticket in self._outcomes and ticket not in self._abandoned:
                    self._outcomes[ticket] = outcome
            self._cv.notify_all()

    # -- ephemeral resources (ESCHER §4.3) ----------------------------------------------------
    def _resource_nodes(self, name: str, node: str | None) -> list[str]:
        if not isinstance(name, str) or not name:
            raise ConfigError("resource name", name, "must be a non-empty string")
        names = [n.name for n in self._capacity]
        if node is not None and node not in names:
            raise ConfigError("node", node, f"not in this pool (nodes: {names})")
        return names if node is None else [node]

    def set_resource(self, name: str, capacity: float, node: str | None = None) -> None:
        """Create or resize ephemeral resource ``name`` on ``node`` (default: every node); 0 deletes it.

        Shrinking below what tasks hold never revokes them: nothing new is granted until usage
        falls under the new capacity.
        """
        nodes = self._resource_nodes(name, node)
        positive(capacity, f"resources[{name!r}].capacity", allow_zero=True)  # NaN would be NULL in SQLite
        with self._tx("set a resource") as db:
            for n in nodes:
                if capacity == 0:
                    db.execute("DELETE FROM resources WHERE node=? AND name=?", (n, name))
                else:
                    db.execute("INSERT OR REPLACE INTO resources (node, name, capacity) VALUES (?,?,?)",
                               (n, name, float(capacity)))
            self._plan(db)

    def adjust_resource(self, name: str, delta: float, node: str | None = None) -> dict[str, float]:
        """Add ``delta`` to ``name`` on ``node`` (None: every node) atomically; a capacity reaching 0 deletes it."""
        nodes = self._resource_nodes(name, node)
        number(delta, f"resources[{name!r}].delta")
        out = {}
        with self._tx("adjust a resource") as db:
            for n in nodes:
                row = db.execute("SELECT capacity FROM resources WHERE node=? AND name=?", (n, name)).fetchone()
                out[n] = max(0.0, (row[0] if row else 0.0) + delta)
                if out[n] == 0:
                    db.execute("DELETE FROM resources WHERE node=? AND name=?", (n, name))
                else:
                    db.execute("INSERT OR REPLACE INTO resources (node, name, capacity) VALUES (?,?,?)", (n, name, out[n]))
            self._plan(db)
        return out

    def lease_resource(self, lease_id: str, name: str, capacity: float) -> None:
        """Create ``name`` on the node of lease ``lease_id``, backed by it (ESCHER's ghost, P4): a request
        for it and for no GPU of its own runs on the ghost's devices (its ``CUDA_VISIBLE_DEVICES``), and
        the resource is deleted when the lease ends (released, or reclaimed with a dead holder)."""
        self._resource_nodes(name, None)
        capacity = positive(capacity, f"resources[{name!r}].capacity")
        with self._tx("lease a resource") as db:
            row = db.execute("SELECT node FROM leases WHERE id=?", (lease_id,)).fetchone()
            if row is None:
                raise LeaseLost(f"lease {lease_id} is not held: {self._loss_reason(lease_id)}")
            db.execute("INSERT OR REPLACE INTO resources (node, name, capacity, lease) VALUES (?,?,?,?)",
                       (row[0], name, capacity, lease_id))
            self._plan(db)

    def resources(self) -> dict[str, dict[str, tuple[float, float]]]:
        """node -> ephemeral resource -> (capacity, available); nodes without any are left out."""
        with self._tx("read the resources") as db:
            caps = db.execute("SELECT node, name, capacity FROM resources").fetchall()
            free = {n.name: n.resources_free for n in self._free_state(db)}
        out: dict[str, dict[str, tuple[float, float]]] = {}
        for node, name, cap in caps:
            out.setdefault(node, {})[name] = (cap, free[node].get(name, cap))
        return out

    def cluster_status(self) -> dict[str, dict[str, tuple[float, float]]]:
        with self._tx("read the cluster status") as db:
            caps = db.execute("SELECT node, name, capacity FROM resources").fetchall()
            nodes = self._free_state(db)
        return status_of(nodes, caps)

    # -- inspection ---------------------------------------------------------------------------
    def free_state(self) -> list[NodeState]:
        with self._tx("read the pool") as db:
            self._reclaim(db)
            return self._free_state(db)

    def leases(self) -> list[Lease]:
        with self._tx("read the leases") as db:
            rows = db.execute(f"SELECT {_LEASE_COLS} FROM leases").fetchall()
        return [self._placement(r) for r in rows]

    def waiting(self) -> int:
        with self._tx("read the queue") as db:
            return db.execute("SELECT COUNT(*) FROM tickets").fetchone()[0]

    def events(self, since_id: int = 0) -> list[dict]:
        with self._tx("read the events") as db:
            rows = db.execute(f"SELECT id, {_EVENT_COLS} FROM events WHERE id > ? ORDER BY id", (since_id,)).fetchall()
        keys = ("id", *_EVENT_COLS.split(", "))
        return [dict(zip(keys, r)) for r in rows]

    def describe(self) -> list[str]:
        """Lines for ``gpuflows pool``: free capacity, resources, each lease with its holder's state."""
        lines = []
        for n in self.free_state():
            lines.append(f"node {n.name}: {n.cpus_free:g}/{n.cpus_total:g} CPUs free")
            for d in n.devices:
                lines.append(f"  gpu{d.index}: compute {d.compute_free:.2f} free, memory "
                             f"{format_memory(max(d.memory_free, 0))}/{format_memory(d.memory_total)} free")
        for node, res in self.resources().items():
            for name, (cap, avail) in res.items():
                lines.append(f"  resource {name}@{node}: {avail:g}/{cap:g} available")
        with self._tx("read the leases") as db:
            rows = db.execute(f"SELECT {_LEASE_COLS}, host, space, pid, expires_at FROM leases").fetchall()
            waiting = db.execute("SELECT COUNT(*) FROM tickets").fetchone()[0]
        now = time.time()
        for r in rows:
            host, space, pid, expires = r[-4:]
            holder = _where(host, space, pid)
            if pids_visible(host, space) and process_state(pid) == "T":
                holder += " (stopped: keeps its slices until it resumes or dies)"
            elif expires < now:
                holder += f" (no heartbeat for {now - expires + self.lease_ttl:.0f} s)"
            lines.append(f"lease {self._placement(r[:-4]).describe()} held by {holder}")
        lines.append(f"{waiting} request(s) waiting")
        return lines


def _where(host: str, space: str | None, pid: int) -> str:
    """A holder's process as this process can name it (its pid means nothing outside its pid space)."""
    if pids_visible(host, space):
        return f"pid {pid}"
    return f"pid {pid} on {host}" if host != HOST else f"pid {pid} in another pid namespace of this host"


def status_of(nodes: list[NodeState], capacities) -> dict[str, dict[str, tuple[float, float]]]:
    """ESCHER's cluster status from free node states and ``(node, name, capacity)`` rows: physical
    ``CPU`` and ``GPU`` (whole idle devices) beside each ephemeral resource, as (capacity, available)."""
    out = {n.name: {"CPU": (n.cpus_total, n.cpus_free),
                    "GPU": (float(len(n.devices)), float(sum(d.idle for d in n.devices)))} for n in nodes}
    for node, name, cap in capacities:
        free = next(n.resources_free for n in nodes if n.name == node)
        out[node][name] = (cap, free.get(name, cap))
    return out


def open_ledger(pool_id: str) -> PoolLedger:
    """The ledger ``pool_id`` names: the one open in this process, else its file opened from the layout it
    stores (another process's pool, e.g. a task's worker reaching its runner's pool)."""
    if pool_id in _OPEN:
        return _OPEN[pool_id]
    if not pool_id or pool_id.startswith("memory:") or not os.path.isfile(pool_id):
        raise ConfigError("pool", pool_id, "no such pool here (an in-memory pool is reachable only in its process)")
    try:
        with closing(sqlite3.connect(f"file:{pool_id}?mode=ro", uri=True, timeout=LOCK_TIMEOUT_S)) as db:
            row = db.execute("SELECT value FROM meta WHERE key='spec'").fetchone()
    except sqlite3.Error as exc:
        raise describe_error(exc, pool_id, "read the pool's layout") from exc
    if row is None:
        raise ConfigError("pool", pool_id, "its ledger stores no layout")
    nodes = tuple(Node(name, tuple(Device(i, f"SIM-{name}-{i}", "GPU", mem, mem, simulated=True) for i, mem in devices),
                       float(cpus)) for name, cpus, devices in json.loads(row[0]))
    return PoolLedger(PoolSpec(nodes), pool_id, heartbeat=False)


def register_worker(path: str, owner_key: str) -> None:
    """Record this process as one that may run on the slices of ``owner_key`` in pool file ``path``.

    Called by a task runner's worker process at start-up: the ledger then keeps the owner's slices
    until this process has died too, so an orphaned worker never shares a GPU with a new holder.
    """
    pid = os.getpid()
    try:
        db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=LOCK_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        raise describe_error(exc, path, "register a worker process") from exc
    try:
        db.execute(f"INSERT OR REPLACE INTO workers ({_HOLDER_COLS}) VALUES (?,?,?,?,?)",
                   (owner_key, HOST, pid, process_start(pid), PID_SPACE))
    except sqlite3.Error as exc:
        raise describe_error(exc, path, "register a worker process") from exc
    finally:
        db.close()
