"""The pool ledger's file: its identity, the lock every client holds, and what SQLite errors mean.

A pool file that is deleted, truncated, replaced or rolled back under live clients must never come
back as a pool that grants their GPUs again. Four things guard it:

* every open client holds a shared ``flock`` on ``<pool>.lock`` for its whole life, so a process
  that finds the pool file missing, empty or older than the pool while that lock is held knows live
  clients lost it;
* a pool id (random, written once into the file) and the file's (device, inode) identity are
  remembered by every client and checked at the start of each transaction;
* an epoch, counting the pool's committed changes, is kept in the file and, after each commit, in
  ``<pool>.epoch`` beside it: a file whose epoch is behind the sidecar's (restored from an older copy
  without its -wal, or rolled back) is refused while live clients hold the pool;
* when the lock file itself is gone too, ``/proc`` shows live processes still holding the deleted
  pool file open.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpu.errors import ConfigError, LedgerBusy, LedgerError, LedgerReplaced
from gpu.liveness import lock_holders, process_state, processes_holding

log = logging.getLogger("gpuflows.ledger")

LOCK_TIMEOUT_S = 30.0
_MARK_BYTES = 64  # the epoch sidecar's record: "<pool id> <epoch>\n", padded
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
    epoch: int = 0  # the newest epoch this client saw committed
    _lock_fd: int = -1
    _epoch_fd: int = -1

    @property
    def lock_path(self) -> str:
        return self.path + ".lock"

    @property
    def epoch_path(self) -> str:
        return self.path + ".epoch"

    def open(self, create_schema: Callable[[sqlite3.Connection], None],
             schema_current: Callable[[sqlite3.Connection], bool]) -> sqlite3.Connection:
        """Open the file, creating the pool only if no live client holds a pool at this path.

        ``create_schema(db)`` creates the tables (idempotent) inside the opening transaction, run only when
        ``schema_current(db)`` says the file lacks them: opening a current pool only reads.
        """
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            self._epoch_fd = os.open(self.epoch_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            self.close()
            raise describe_os_error(exc, self.path, "open the pool") from exc
        try:
            if self._looks_new():
                self._take_fresh_lock()
            else:
                fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
            db = self._connect_and_adopt(create_schema, schema_current)
            try:
                self._adopt_epoch(db)
            except BaseException:
                db.close()
                raise
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)  # downgrade after creating or adopting; no-op otherwise
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

    def verify(self, db: sqlite3.Connection) -> int:
        """Raise LedgerReplaced unless the path is still our file, it still holds our pool, and it is not older
        than the pool (its epoch behind one this client or the sidecar saw committed); the file's epoch."""
        try:
            st = os.stat(self.path)
            same_file = (st.st_dev, st.st_ino) == self.identity and st.st_size > 0
        except FileNotFoundError:
            same_file = False
        meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('pool_id', 'epoch')")) if same_file else {}
        if meta.get("pool_id") != self.pool_id:
            raise LedgerReplaced(f"pool ledger {self.path} was deleted, truncated or replaced while this process "
                                 f"(pid {os.getpid()}) held the pool open; its leases can no longer be trusted")
        epoch = int(meta.get("epoch", 0))
        mark = self._read_mark()
        newest = max(self.epoch, mark[1] if mark and mark[0] == self.pool_id else 0)
        if epoch < newest:
            raise LedgerReplaced(f"pool ledger {self.path} went back from epoch {newest} to {epoch} while this process "
                                 f"(pid {os.getpid()}) held the pool open: it was restored from an older copy or "
                                 "rolled back; its leases can no longer be trusted")
        return epoch

    @staticmethod
    def stamp(db: sqlite3.Connection, epoch: int) -> int:
        """Inside a transaction that changed the pool: record its epoch (the one ``verify`` read, plus one)."""
        db.execute("INSERT OR REPLACE INTO meta VALUES ('epoch', ?)", (str(epoch + 1),))
        return epoch + 1

    def committed(self, epoch: int) -> None:
        """After the commit of ``epoch``: raise the sidecar's mark to it (never lower it: another process may have
        committed a later epoch and marked it first). A mark that cannot be written only weakens the check."""
        self.epoch = max(self.epoch, epoch)
        try:
            fcntl.flock(self._epoch_fd, fcntl.LOCK_EX)
            try:
                mark = self._parse_mark(os.pread(self._epoch_fd, _MARK_BYTES, 0))
                if mark is None or mark[0] != self.pool_id or mark[1] < epoch:
                    self._write_mark(epoch)
            finally:
                fcntl.flock(self._epoch_fd, fcntl.LOCK_UN)
        except OSError as exc:
            log.warning("pool %s: could not record epoch %d in %s: %s", self.path, epoch, self.epoch_path, exc)

    def _adopt_epoch(self, db: sqlite3.Connection) -> None:
        """Refuse a file older than the pool's last commits while live clients hold the pool: a copy restored
        without its -wal lacks their leases. With no live client left, the file is the pool from now on."""
        row = db.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()
        self.epoch = int(row[0]) if row else 0
        mark = self._read_mark()
        if mark is None or (mark[0] == self.pool_id and mark[1] <= self.epoch):
            self.committed(self.epoch)  # a new sidecar gets its first mark
            return
        if not self._alone():
            behind = f"epoch {self.epoch}, behind the {mark[1]} its clients committed" if mark[0] == self.pool_id \
                else f"pool {self.pool_id}, not the pool {mark[0]} its clients hold"
            who = processes_holding([self.lock_path])
            raise LedgerReplaced(
                f"pool ledger {self.path} holds {behind}: it was restored from an older copy, rolled back or replaced "
                f"while live processes (pids {', '.join(map(str, who[:8])) or 'unknown'}) held the pool. Opening it "
                "would grant their GPUs again; stop those processes first (then this file is the pool)")
        log.warning("pool %s: adopting the file at epoch %d (the pool had reached %s, with no client left)",
                    self.path, self.epoch, mark)
        fcntl.flock(self._epoch_fd, fcntl.LOCK_EX)
        try:
            self._write_mark(self.epoch)  # lowered: this file is the pool now
        finally:
            fcntl.flock(self._epoch_fd, fcntl.LOCK_UN)

    def _alone(self) -> bool:
        """Whether no other client holds the pool (this one's shared lock becomes exclusive until ``open`` ends)."""
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)  # a failed conversion gave up the shared lock (flock(2))
            return False

    def _read_mark(self) -> tuple[str, int] | None:
        fcntl.flock(self._epoch_fd, fcntl.LOCK_SH)
        try:
            return self._parse_mark(os.pread(self._epoch_fd, _MARK_BYTES, 0))
        finally:
            fcntl.flock(self._epoch_fd, fcntl.LOCK_UN)

    @staticmethod
    def _parse_mark(data: bytes) -> tuple[str, int] | None:
        """``(pool id, epoch)`` from the sidecar's record; None when it is empty or not one."""
        fields = data.decode("ascii", "replace").split()
        return (fields[0], int(fields[1])) if len(fields) == 2 and fields[1].isdigit() else None

    def _write_mark(self, epoch: int) -> None:
        """One fixed-width record, so a reader under the shared lock never sees a mix of two."""
        os.pwrite(self._epoch_fd, f"{self.pool_id} {epoch:020d}\n".encode().ljust(_MARK_BYTES), 0)

    def close(self) -> None:
        for name in ("_lock_fd", "_epoch_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)  # drops the flock
                setattr(self, name, -1)
