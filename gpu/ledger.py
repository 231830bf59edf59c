"""The pool ledger: the one owner of who holds which slice of which GPU.

State lives in SQLite so that every flow run using the same pool, in any process on this
machine, shares one ledger: each grant runs in a ``BEGIN IMMEDIATE`` transaction, so two
deployments never over-commit a device. (On a Ray cluster the same class runs inside one
named actor instead, see ``tasks.ray_runner``.) ``path=None`` keeps the ledger in memory for
single-process use and for simulations.

Requests wait in a queue of tickets; the ``PlacementPolicy`` orders them and picks devices
(default FIFO + best fit). A request that can never fit fails at once with an error naming it
and the pool's totals. Leases carry their holder's host, pid and an expiry refreshed by a
heartbeat, so a crashed holder's slices are reclaimed instead of stranded.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

from gpu.devices import PoolSpec
from gpu.errors import AllocationTimeout, ConfigError
from gpu.placement import (
    Choice, DeviceState, FifoBestFit, NodeState, PlacementPolicy, Request, Waiting,
    check_ever_fits, plan_grants,
)
from gpu.scenario import positive
from gpu.units import format_memory

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS leases (
  id TEXT PRIMARY KEY, owner TEXT, host TEXT, pid INTEGER, pstart INTEGER, label TEXT,
  node TEXT, devices TEXT, fraction REAL, memory INTEGER, cpus REAL, resources TEXT,
  granted_at REAL, expires_at REAL);
CREATE TABLE IF NOT EXISTS tickets (
  id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT, host TEXT, pid INTEGER, pstart INTEGER,
  request TEXT, priority REAL, created_at REAL, expires_at REAL);
CREATE TABLE IF NOT EXISTS resources (node TEXT, name TEXT, capacity REAL, PRIMARY KEY (node, name));
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL, kind TEXT, lease_id TEXT, label TEXT,
  node TEXT, devices TEXT, fraction REAL, memory INTEGER);
"""
_KEEP_EVENTS = 20_000


def _process_start(pid: int) -> int:
    """Kernel start time of ``pid`` (guards against pid reuse); 0 where /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def _process_alive(pid: int, pstart: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # killed but not yet reaped
        return False
    return not pstart or int(fields[19]) == pstart


@dataclass(frozen=True)
class Owner:
    """Who holds a lease or a ticket: a process on a host (plus a token per ledger client)."""

    host: str
    pid: int
    pstart: int
    token: str

    @classmethod
    def this_process(cls) -> "Owner":
        return cls(socket.gethostname(), os.getpid(), _process_start(os.getpid()), uuid.uuid4().hex[:8])

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}:{self.token}"


@dataclass(frozen=True)
class Placement:
    """A granted slice: what the task may use and how to point CUDA at it."""

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
    def from_dict(cls, d: Mapping) -> "Placement":
        return cls(**{**d, "devices": tuple(d["devices"]), "resources": dict(d.get("resources") or {})})


class LedgerClient:
    """Blocking allocation on top of submit/try_grant/cancel; shared by the local and Ray ledgers."""

    poll_interval: float = 0.2

    def submit(self, request: Request, priority: float = 0.0) -> int:
        raise NotImplementedError

    def try_grant(self, ticket: int) -> Placement | None:
        raise NotImplementedError

    def cancel(self, ticket: int) -> None:
        raise NotImplementedError

    def release(self, lease_id: str) -> bool:
        raise NotImplementedError

    def _wait_for_change(self, timeout: float) -> None:
        time.sleep(timeout)

    def submit_and_try(self, request: Request, priority: float = 0.0) -> tuple[int, Placement | None]:
        """``submit`` then a first ``try_grant``; ledgers override it to do both in one step."""
        ticket = self.submit(request, priority)
        try:
            return ticket, self.try_grant(ticket)
        except BaseException:
            self.cancel(ticket)
            raise

    def allocate(self, request: Request, timeout: float | None = None,
                 cancel_event: threading.Event | None = None, priority: float = 0.0) -> Placement:
        """Wait (FIFO by default) until ``request`` is granted; raise AllocationTimeout after ``timeout``
        seconds, or InterruptedError when ``cancel_event`` is set. Never-fitting requests raise at once."""
        ticket, placement = self.submit_and_try(request, priority)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        try:
            while True:
                if placement is not None:
                    return placement
                if cancel_event is not None and cancel_event.is_set():
                    raise InterruptedError(f"request {request.describe()} was cancelled while waiting")
                if deadline is not None and time.monotonic() >= deadline:
                    raise AllocationTimeout(f"request {request.describe()} got no placement within {timeout}s")
                wait = min(delay, self.poll_interval)
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                self._wait_for_change(wait)
                delay *= 2
                placement = self.try_grant(ticket)
        except BaseException:
            self.cancel(ticket)
            raise

    @contextmanager
    def lease(self, request: Request, timeout: float | None = None) -> Iterator[Placement]:
        """``with ledger.lease(Request(gpus=0.5)) as p:`` releases on exit, also after an exception."""
        placement = self.allocate(request, timeout)
        try:
            yield placement
        finally:
            self.release(placement.lease_id)


class PoolLedger(LedgerClient):
    """SQLite-backed ledger of one pool, shared by every process that opens the same ``path``."""

    def __init__(self, spec: PoolSpec, path: str | Path | None = None, policy: PlacementPolicy | None = None,
                 lease_ttl: float = 30.0, heartbeat: bool = True):
        positive(lease_ttl, "lease_ttl")  # finite too: the heartbeat sleeps a third of it
        self.spec = spec
        self.path = str(path) if path else ":memory:"
        self.policy: PlacementPolicy = policy or FifoBestFit()
        self.lease_ttl = lease_ttl
        self.owner = Owner.this_process()
        self._shared = path is not None
        if self._shared:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._parsed_requests: dict[int, Request] = {}
        self._changed = threading.Condition(self._lock)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        try:
            if self._shared:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise ConfigError("pool", self.path, f"is not a pool ledger this version can open ({exc}); "
                                                 "move it away to start the pool afresh") from exc
        self._capacity = self._capacity_from_spec(spec)
        with self._tx() as db:
            self._sync_spec(db)
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._want_heartbeat = heartbeat

    @property
    def capacity(self) -> list[NodeState]:
        """The pool's capacity when empty (used to reject never-fitting requests up front)."""
        return self._capacity

    # -- plumbing -------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @staticmethod
    def _capacity_from_spec(spec: PoolSpec) -> list[NodeState]:
        return [NodeState(n.name, tuple(DeviceState(d.index, d.memory_total, uuid=d.uuid) for d in n.devices),
                          n.cpus, n.cpus) for n in spec.nodes]

    def _sync_spec(self, db: sqlite3.Connection) -> None:
        wanted = json.dumps([[n.name, n.cpus, [[d.index, d.memory_total] for d in n.devices]] for n in self.spec.nodes])
        row = db.execute("SELECT value FROM meta WHERE key='spec'").fetchone()
        if row and row[0] != wanted:
            self._reclaim(db)
            if db.execute("SELECT COUNT(*) FROM leases").fetchone()[0]:
                raise ConfigError("pool", self.path, "is in use by leases on a different device set; release them first")
        db.execute("INSERT OR REPLACE INTO meta VALUES ('spec', ?)", (wanted,))

    def _ensure_heartbeat(self) -> None:
        if not self._want_heartbeat or (self._heartbeat_thread and self._heartbeat_thread.is_alive()):
            return
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="gpuflows-ledger-heartbeat",
                                                  daemon=True)
        self._heartbeat_thread.start()

    def _heartbeat_loop(self) -> None:
        while not self._heartbeat_stop.wait(self.lease_ttl / 3):
            try:
                self.heartbeat()
            except sqlite3.Error:
                pass

    def close(self) -> None:
        self._heartbeat_stop.set()
        with self._lock:
            self._db.close()

    def _wait_for_change(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def _owner_row(self, owner: Owner | None) -> tuple:
        o = owner or self.owner
        return o.key, o.host, o.pid, o.pstart

    def _reclaim(self, db: sqlite3.Connection) -> int:
        """Drop leases and tickets whose holder died (same host) or stopped heartbeating."""
        now, host = time.time(), socket.gethostname()
        # One liveness check per holder on this host (not per row); SQLite scans the rows.
        holders = db.execute("SELECT pid, pstart FROM leases WHERE host=? UNION SELECT pid, pstart FROM tickets "
                             "WHERE host=?", (host, host)).fetchall()
        dead_holders = [(pid, pstart) for pid, pstart in holders if not _process_alive(pid, pstart)]
        where = "expires_at < ?" + " OR (host=? AND pid=? AND pstart=?)" * len(dead_holders)
        args = [now, *(x for pid, pstart in dead_holders for x in (host, pid, pstart))]
        dead = db.execute(f"SELECT id, label, node, devices, fraction, memory FROM leases WHERE {where}", args).fetchall()
        for r in dead:
            db.execute("DELETE FROM leases WHERE id=?", (r[0],))
            db.execute("INSERT INTO events (t, kind, lease_id, label, node, devices, fraction, memory) VALUES (?,?,?,?,?,?,?,?)",
                       (now, "reclaim", *r))
        db.execute(f"DELETE FROM tickets WHERE {where}", args)
        return len(dead)

    def _free_state(self, db: sqlite3.Connection) -> list[NodeState]:
        used_c: dict[tuple[str, int], float] = {}
        used_m: dict[tuple[str, int], int] = {}
        used_cpu: dict[str, float] = {}
        used_res: dict[tuple[str, str], float] = {}
        # Summed per distinct (node, devices, resources) in SQLite: Python sees a few groups, not every lease.
        for node, devices, res, fraction, memory, cpus, count in db.execute(
                "SELECT node, devices, resources, SUM(fraction), SUM(memory), SUM(cpus), COUNT(*) FROM leases "
                "GROUP BY node, devices, resources"):
            for i in json.loads(devices):
                used_c[(node, i)] = used_c.get((node, i), 0.0) + fraction
                used_m[(node, i)] = used_m.get((node, i), 0) + memory
            used_cpu[node] = used_cpu.get(node, 0.0) + cpus
            for k, v in json.loads(res).items():
                used_res[(node, k)] = used_res.get((node, k), 0.0) + v * count
        caps: dict[str, dict[str, float]] = {}
        for node, name, cap in db.execute("SELECT node, name, capacity FROM resources"):
            caps.setdefault(node, {})[name] = cap
        out = []
        for n in self._capacity:
            devices = tuple(DeviceState(d.index, d.memory_total, 1.0 - used_c.get((n.name, d.index), 0.0),
                                        d.memory_total - used_m.get((n.name, d.index), 0), d.uuid) for d in n.devices)
            res = {k: cap - used_res.get((n.name, k), 0.0) for k, cap in caps.get(n.name, {}).items()}
            out.append(NodeState(n.name, devices, n.cpus_total, n.cpus_total - used_cpu.get(n.name, 0.0), res))
        return out

    # -- requests ---------------------------------------------------------------------------
    def _check(self, request: Request) -> None:
        if request.node is not None and request.node not in {n.name for n in self._capacity}:
            raise ConfigError("node", request.node, f"not in this pool (nodes: {[n.name for n in self._capacity]})")
        check_ever_fits(request, self._capacity)

    def _insert_ticket(self, db: sqlite3.Connection, request: Request, priority: float, owner: Owner | None) -> int:
        now = time.time()
        cur = db.execute("INSERT INTO tickets (owner, host, pid, pstart, request, priority, created_at, expires_at) "
                         "VALUES (?,?,?,?,?,?,?,?)",
                         (*self._owner_row(owner), json.dumps(request.to_dict()), priority, now, now + self.lease_ttl))
        return int(cur.lastrowid)

    def submit(self, request: Request, priority: float = 0.0, owner: Owner | None = None) -> int:
        """Queue ``request``; raise NeverFitsError at once if it can never fit this pool."""
        self._check(request)
        with self._tx() as db:
            ticket = self._insert_ticket(db, request, priority, owner)
        self._ensure_heartbeat()
        return ticket

    def submit_and_try(self, request: Request, priority: float = 0.0,
                       owner: Owner | None = None) -> tuple[int, Placement | None]:
        """``submit`` and a first ``try_grant`` in one transaction (most requests fit at once)."""
        self._check(request)
        with self._tx() as db:
            ticket = self._insert_ticket(db, request, priority, owner)
            placement = self._try_grant(db, ticket, owner)
        self._ensure_heartbeat()
        return ticket, placement

    def try_grant(self, ticket: int, owner: Owner | None = None) -> Placement | None:
        """Grant ``ticket`` now if the policy places it in this pass; otherwise None (keep waiting)."""
        with self._tx() as db:
            return self._try_grant(db, ticket, owner)

    def _try_grant(self, db: sqlite3.Connection, ticket: int, owner: Owner | None) -> Placement | None:
        # Slices of dead holders only make the pool look fuller, so a grant planned before reclaiming
        # never over-commits; reclaim (scans and /proc reads) only when the ticket does not fit yet.
        placement = self._plan_and_grant(db, ticket, owner)
        if placement is None:
            self._reclaim(db)
            placement = self._plan_and_grant(db, ticket, owner)
        if placement is None:
            db.execute("UPDATE tickets SET expires_at=? WHERE id=?", (time.time() + self.lease_ttl, ticket))
        else:
            self._changed.notify_all()  # we hold the ledger lock inside the transaction
        return placement

    def _plan_and_grant(self, db: sqlite3.Connection, ticket: int, owner: Owner | None) -> Placement | None:
        now = time.time()
        rows = db.execute("SELECT id, request, priority FROM tickets").fetchall()
        if not any(r[0] == ticket for r in rows):
            raise KeyError(f"ticket {ticket} is not waiting (cancelled, expired or already granted)")
        # A ticket's request never changes: parse each once (kept while the ticket waits).
        parsed = self._parsed_requests
        self._parsed_requests = {r[0]: parsed.get(r[0]) or Request.from_dict(json.loads(r[1])) for r in rows}
        waiting = [Waiting(r[0], self._parsed_requests[r[0]], r[2]) for r in rows]
        grants = plan_grants(self.policy, waiting, self._free_state(db), until=ticket)
        choice: Choice | None = grants.get(ticket)
        if choice is None:
            return None
        request = self._parsed_requests[ticket]
        placement = Placement(uuid.uuid4().hex, choice.node, choice.devices, choice.fraction, choice.memory,
                              request.cpus, dict(request.resources), request.label, self.spec.simulated, now)
        key, host, pid, pstart = self._owner_row(owner)
        db.execute("DELETE FROM tickets WHERE id=?", (ticket,))
        db.execute("INSERT INTO leases VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                   (placement.lease_id, key, host, pid, pstart, placement.label, placement.node,
                    json.dumps(list(placement.devices)), placement.fraction, placement.memory, placement.cpus,
                    json.dumps(dict(placement.resources)), now, now + self.lease_ttl))
        self._log(db, "allocate", placement)
        return placement

    def cancel(self, ticket: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM tickets WHERE id=?", (ticket,))
            self._changed.notify_all()

    def release(self, lease_id: str) -> bool:
        """Return a lease's slice to the pool; False if it was already released or reclaimed."""
        with self._tx() as db:
            row = db.execute("SELECT label, node, devices, fraction, memory FROM leases WHERE id=?", (lease_id,)).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM leases WHERE id=?", (lease_id,))
            db.execute("INSERT INTO events (t, kind, lease_id, label, node, devices, fraction, memory) VALUES (?,?,?,?,?,?,?,?)",
                       (time.time(), "release", lease_id, *row))
            self._changed.notify_all()
        return True

    def heartbeat(self, owner: Owner | None = None) -> None:
        """Extend the expiry of everything ``owner`` holds or waits for."""
        key = (owner or self.owner).key
        with self._tx() as db:
            exp = time.time() + self.lease_ttl
            db.execute("UPDATE leases SET expires_at=? WHERE owner=?", (exp, key))
            db.execute("UPDATE tickets SET expires_at=? WHERE owner=?", (exp, key))

    def _log(self, db: sqlite3.Connection, kind: str, p: Placement) -> None:
        cur = db.execute("INSERT INTO events (t, kind, lease_id, label, node, devices, fraction, memory) VALUES (?,?,?,?,?,?,?,?)",
                         (time.time(), kind, p.lease_id, p.label, p.node, json.dumps(list(p.devices)), p.fraction, p.memory))
        if cur.lastrowid % 1000 == 0:
            db.execute("DELETE FROM events WHERE id <= ?", (cur.lastrowid - _KEEP_EVENTS,))

    # -- ephemeral resources (ESCHER §2) ------------------------------------------------------
    def set_resource(self, name: str, capacity: float, node: str | None = None) -> None:
        """Create or resize ephemeral resource ``name`` on ``node`` (default: every node); 0 deletes it.

        Shrinking below what tasks hold never revokes them: nothing new is granted until usage
        falls under the new capacity.
        """
        positive(capacity, f"resources[{name!r}].capacity", allow_zero=True)  # NaN would be NULL in SQLite
        nodes = [n.name for n in self._capacity] if node is None else [node]
        if node is not None and node not in {n.name for n in self._capacity}:
            raise ConfigError("node", node, "not in this pool")
        with self._tx() as db:
            for n in nodes:
                if capacity == 0:
                    db.execute("DELETE FROM resources WHERE node=? AND name=?", (n, name))
                else:
                    db.execute("INSERT OR REPLACE INTO resources VALUES (?,?,?)", (n, name, float(capacity)))
            self._changed.notify_all()

    def delete_resource(self, name: str, node: str | None = None) -> None:
        self.set_resource(name, 0, node)

    def resources(self) -> dict[str, dict[str, tuple[float, float]]]:
        """node -> resource -> (capacity, available)."""
        with self._tx() as db:
            caps = db.execute("SELECT node, name, capacity FROM resources").fetchall()
            free = {n.name: n.resources_free for n in self._free_state(db)}
        out: dict[str, dict[str, tuple[float, float]]] = {}
        for node, name, cap in caps:
            out.setdefault(node, {})[name] = (cap, free[node].get(name, cap))
        return out

    # -- inspection ---------------------------------------------------------------------------
    def free_state(self) -> list[NodeState]:
        with self._tx() as db:
            self._reclaim(db)
            return self._free_state(db)

    def leases(self) -> list[Placement]:
        with self._tx() as db:
            rows = db.execute("SELECT id, node, devices, fraction, memory, cpus, resources, label, granted_at FROM leases").fetchall()
        return [Placement(r[0], r[1], tuple(json.loads(r[2])), r[3], r[4], r[5], json.loads(r[6]), r[7],
                          self.spec.simulated, r[8]) for r in rows]

    def waiting(self) -> int:
        with self._tx() as db:
            return db.execute("SELECT COUNT(*) FROM tickets").fetchone()[0]

    def events(self, since_id: int = 0) -> list[dict]:
        with self._tx() as db:
            rows = db.execute("SELECT id, t, kind, lease_id, label, node, devices, fraction, memory FROM events "
                              "WHERE id > ? ORDER BY id", (since_id,)).fetchall()
        keys = ("id", "t", "kind", "lease_id", "label", "node", "devices", "fraction", "memory")
        return [dict(zip(keys, r)) for r in rows]

    def describe(self) -> list[str]:
        lines = []
        for n in self.free_state():
            lines.append(f"node {n.name}: {n.cpus_free:g}/{n.cpus_total:g} CPUs free")
            for d in n.devices:
                lines.append(f"  gpu{d.index}: compute {d.compute_free:.2f} free, memory "
                             f"{format_memory(max(d.memory_free, 0))}/{format_memory(d.memory_total)} free")
        for node, res in self.resources().items():
            for name, (cap, avail) in res.items():
                lines.append(f"  resource {name}@{node}: {avail:g}/{cap:g} available")
        lines += [f"lease {p.describe()}" for p in self.leases()]
        lines.append(f"{self.waiting()} request(s) waiting")
        return lines
