"""The pool ledger's file: its identity, the lock every client holds, and what SQLite errors mean.

A pool file that is deleted, truncated or replaced under live clients must never come back as an
empty pool that grants their GPUs again. Three things guard it:

* every open client holds a shared ``flock`` on ``<pool>.lock`` for its whole life, so a process
  that finds the pool file missing or empty while that lock is held knows live clients lost it;
* a pool id (random, written once into the file) and the file's (device, inode) identity are
  remembered by every client and checked at the start of each transaction;
* when the lock file itself is gone too, ``/proc`` shows live processes still holding the deleted
  pool file open.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpu.errors import ConfigError, LedgerBusy, LedgerError, LedgerReplaced
from gpu.liveness import lock_holders, process_state, processes_holding

LOCK_TIMEOUT_S = 30.0
WAL_WRITE_LOCK = 120  # the byte of the -shm file a WAL database's writer locks (SQLite's wal.c, WALINDEX_LOCK_OFFSET)


def write_lock_holder(path: str) -> str:
    """Who holds ``path``'s write lock, as a phrase naming the process and whether it is stopped."""
    pids = lock_holders(f"{path}-shm", WAL_WRITE_LOCK)
    if not pids:
        return "another process"
    states = {"T": " (stopped: resume it with kill -CONT, or end it)", "t": " (stopped by a debugger)",
              "D": " (in uninterruptible I/O)"}
    return " and ".join(f"pid {pid}{states.get(process_state(pid), '')}" for pid in pids)


def unwritable(path: str) -> str | None:
    """Why this process cannot write in ``path``'s folder, or None if it can. Even reading a pool needs to: SQLite
    keeps a WAL database's -wal and -shm files beside it, and every client takes the pool's lock file."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"the file system holding {folder} is read-only"
    except OSError:
        return None
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable by this process (uid {os.geteuid()})"
    return None


def describe_os_error(exc: OSError, path: str, action: str) -> LedgerError:
    """One sentence for a failed file operation on the pool's files (its folder, its lock)."""
    why = unwritable(path) if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else None
    return LedgerError(f"pool ledger {path}: could not {action}: {why or f'{exc.strerror} ({exc.filename})'}; "
                       "nothing was changed")


def describe_error(exc: sqlite3.Error, path: str, action: str) -> LedgerError:
    """One sentence for a SQLite failure: what happened to the pool file and what to do."""
    text = str(exc).lower()
    if "full" in text:
        why = f"the disk holding it is full (free space in {os.path.dirname(path) or '.'}); nothing was changed"
    elif "locked" in text or "busy" in text:
        return LedgerBusy(f"pool ledger {path}: could not {action}: {write_lock_holder(path)} held its write lock "
                          "for longer than this call could wait; nothing was changed")
    elif "readonly" in text or "read-only" in text or "unable to open" in text:
        why = unwritable(path) or ("it is read-only for this process" if "unable" not in text else str(exc))
    elif "malformed" in text or "not a database" in text or "no such table" in text:
        return LedgerReplaced(f"pool ledger {path}: the file was truncated or overwritten while in use ({exc})")
    else:
        why = str(exc)
    return LedgerError(f"pool ledger {path}: could not {action}: {why}")


@dataclass
class LedgerFile:
    """The lock and identity of one pool file, held by one ``PoolLedger`` for its whole life."""

    path: str
    pool_id: str = ""
    identity: tuple[int, int] = (0, 0)
    _lock_fd: int = -1

    @property
    def lock_path(self) -> str:
        return self.path + ".lock"

    def open(self, create_schema: Callable[[sqlite3.Connection], None],
             schema_current: Callable[[sqlite3.Connection], bool]) -> sqlite3.Connection:
        """Open the file, creating the pool only if no live client holds a pool at this path.

        ``create_schema(db)`` creates the tables (idempotent) inside the opening transaction, run only when
        ``schema_current(db)`` says the file lacks them: opening a current pool only reads.
        """
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise describe_os_error(exc, self.path, "open the pool") from exc
        try:
            if self._looks_new():
                self._take_fresh_lock()
            else:
                fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
            db = self._connect_and_adopt(create_schema, schema_current)
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)  # downgrade after creating; no-op otherwise
            return db
        except BaseException:
            self.close()
            raise

    def _looks_new(self) -> bool:
        try:
            return os.stat(self.path).st_size == 0
        except FileNotFoundError:
            return True

    def _take_fresh_lock(self) -> None:
        """Exclusive lock to create the pool; refuse if live clients still hold the one that vanished."""
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Either another process is creating the pool right now (it holds the exclusive lock
            # for a moment), or live clients hold a pool whose file is gone. Wait for a shared
            # lock, then look again.
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
            if self._looks_new():
                self._refuse(processes_holding([self.lock_path]))
            return
        stale = [pid for pid in processes_holding([self.path, self.lock_path]) if self._holds_deleted(pid)]
        if stale:
            self._refuse(stale)

    def _holds_deleted(self, pid: int) -> bool:
        """Whether ``pid`` holds this path's *old* file (deleted, or another inode)."""
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            here = None
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
                if target.endswith(" (deleted)") and target[:-10] in (self.path, self.lock_path):
                    return True
                if target == self.path and here is not None:
                    st = os.stat(fd)
                    if (st.st_dev, st.st_ino) != (here.st_dev, here.st_ino):
                        return True
            except OSError:
                continue
        return False

    def _refuse(self, pids: list[int]) -> None:
        who = f" (pids {', '.join(map(str, pids[:8]))})" if pids else ""
        raise LedgerReplaced(
            f"pool ledger {self.path} is missing or empty, but live processes{who} still hold the pool it held: "
            "the file was deleted or truncated under them. Starting an empty pool would grant their GPUs again; "
            "stop those processes (or restore the file) first")

    def connect(self) -> sqlite3.Connection:
        """A new connection to the file (one per thread of use: threads then wait only on SQLite's lock).

        ``synchronous=NORMAL`` is per connection, so it is set on each: in WAL mode a commit then survives
        a crash of any process (what the pool must survive) without an fsync; only a power loss can undo
        the last commits, and it also ends every process that held those leases. With the default FULL
        every grant and release paid an fsync (~10 ms here).
        """
        db = self._open()
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _open(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=LOCK_TIMEOUT_S)

    def _connect_and_adopt(self, create_schema, schema_current) -> sqlite3.Connection:
        db = self._open()
        try:
            db.execute("PRAGMA journal_mode=WAL")  # writes only to a new file
            db.execute("PRAGMA synchronous=NORMAL")
            self.pool_id = self._stored_pool_id(db, schema_current) or self._create(db, create_schema)
        except sqlite3.DatabaseError as exc:
            db.close()
            if isinstance(exc, sqlite3.OperationalError) and "no such table" not in str(exc):
                raise describe_error(exc, self.path, "open the pool") from exc
            raise ConfigError("pool", self.path, f"is not a pool ledger this version can open ({exc}); "
                                                 "move it away to start the pool afresh") from exc
        st = os.stat(self.path)
        self.identity = (st.st_dev, st.st_ino)
        return db

    @staticmethod
    def _stored_pool_id(db: sqlite3.Connection, schema_current) -> str | None:
        """The pool id of a file that needs no schema change, read without the write lock; else None."""
        db.execute("BEGIN")
        try:
            if not schema_current(db):
                return None
            row = db.execute("SELECT value FROM meta WHERE key='pool_id'").fetchone()
            return row[0] if row else None
        finally:
            db.execute("COMMIT")

    @staticmethod
    def _create(db: sqlite3.Connection, create_schema) -> str:
        """Create or upgrade the schema and the pool id in one write transaction; the pool id."""
        db.execute("BEGIN IMMEDIATE")
        try:
            create_schema(db)
            row = db.execute("SELECT value FROM meta WHERE key='pool_id'").fetchone()
            pool_id = row[0] if row else uuid.uuid4().hex
            db.execute("INSERT OR REPLACE INTO meta VALUES ('pool_id', ?)", (pool_id,))
            db.execute("COMMIT")
            return pool_id
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def verify(self, db: sqlite3.Connection) -> None:
        """Raise LedgerReplaced unless the path is still our file and it still holds our pool."""
        try:
            st = os.stat(self.path)
            same_file = (st.st_dev, st.st_ino) == self.identity and st.st_size > 0
        except FileNotFoundError:
            same_file = False
        row = db.execute("SELECT value FROM meta WHERE key='pool_id'").fetchone() if same_file else None
        if row is None or row[0] != self.pool_id:
            raise LedgerReplaced(f"pool ledger {self.path} was deleted, truncated or replaced while this process "
                                 f"(pid {os.getpid()}) held the pool open; its leases can no longer be trusted")

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = -1
