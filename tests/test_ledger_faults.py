"""The shared pool under real faults: kill -9, SIGSTOP, a held write lock, a wiped file, a full disk.

Holders run in their own processes (``_HOLDER``): the faults are injected into real processes
and a real SQLite file, the way etcd and Kubernetes test leases.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu.devices import PoolSpec, parse_simulated
from gpu.errors import AllocationTimeout, LeaseLost, LedgerBusy, LedgerError, LedgerReplaced
from gpu.ledger import PoolLedger, register_worker
from gpu.placement import ResourceRequest

_HOLDER = """
import sys, threading
import gpu.liveness
if sys.argv[3] != "-":                        # stand in for a process on another machine
    gpu.liveness.HOST = sys.argv[3]
    import gpu.ledger; gpu.ledger.HOST = sys.argv[3]
from gpu.devices import PoolSpec, parse_simulated
from gpu.ledger import PoolLedger
from gpu.placement import ResourceRequest
ledger = PoolLedger(PoolSpec((parse_simulated("2x16GiB", "n0", cpus=8),)), sys.argv[1], lease_ttl=float(sys.argv[2]))
p = ledger.allocate(ResourceRequest(gpus=1, label="held"))
ledger.watch(p.lease_id, lambda reason: print("LOST", reason, flush=True))
print(p.lease_id, ledger.owner.key, flush=True)
for line in sys.stdin:                        # commands from the test
    if line.strip() == "release":
        print("released", ledger.release(p.lease_id), flush=True)
    elif line.strip() == "check":
        try:
            ledger.check(p)
            print("held", flush=True)
        except Exception as exc:
            print(type(exc).__name__, exc, flush=True)
"""


class Holder:
    """A process holding one whole GPU of the pool at ``path``, driven over stdin/stdout; ``prefix`` runs it
    under another command (a new pid namespace)."""

    def __init__(self, path: Path, ttl: float = 30.0, host: str = "-", prefix: tuple[str, ...] = ()):
        self.proc = subprocess.Popen([*prefix, sys.executable, "-c", _HOLDER, str(path), str(ttl), host],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lease_id, self.owner_key = self.proc.stdout.readline().split()

    def say(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def pool(path: Path | None, **kw) -> PoolLedger:
    return PoolLedger(PoolSpec((parse_simulated("2x16GiB", "n0", cpus=8),)), path, **kw)


def waiter(path: Path, **kw) -> PoolLedger:
    """This process's client of the pool, already holding the GPU the holder left free."""
    ledger = pool(path, **kw)
    ledger.allocate(ResourceRequest(gpus=1), timeout=1)
    return ledger


def take_holders_gpu(ledger: PoolLedger, timeout: float) -> float:
    """Seconds until this process gets the holder's GPU, or AllocationTimeout."""
    start = time.monotonic()
    ledger.allocate(ResourceRequest(gpus=1), timeout=timeout)
    return time.monotonic() - start


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "pool.sqlite"


def test_a_failed_grant_never_leaks_into_the_next_request(path, monkeypatch):
    """Disk full mid-grant (SQLite's page limit on every connection: a real SQLITE_FULL): the next request
    gets exactly itself."""
    from gpu.ledger_file import LedgerFile

    limit = {"pages": 1073741823}
    connect = LedgerFile.connect

    def limited(self):
        db = connect(self)
        db.execute(f"PRAGMA max_page_count={limit['pages']}")
        return db

    monkeypatch.setattr(LedgerFile, "connect", limited)
    ledger = pool(path)
    limit["pages"] = ledger._idle[0].execute("PRAGMA page_count").fetchone()[0]
    for db in ledger._idle:
        db.execute(f"PRAGMA max_page_count={limit['pages']}")
    with pytest.raises(LedgerError, match="disk holding it is full") as err:
        ledger.allocate(ResourceRequest(gpus=0.25, label="x" * 9000), timeout=1)
    assert "Traceback" not in str(err.value) and str(path) in str(err.value)
    monkeypatch.undo()
    for db in ledger._idle:
        db.execute("PRAGMA max_page_count=1073741823")
    whole = ledger.allocate(ResourceRequest(gpus=1, label="whole"), timeout=1)
    other = ledger.allocate(ResourceRequest(gpus=1, label="other"), timeout=1)
    assert (whole.fraction, whole.label, other.label) == (1.0, "whole", "other")
    assert whole.devices != other.devices
    assert sorted(p.label for p in pool(path).leases()) == ["other", "whole"]


def test_a_stopped_holder_keeps_its_gpu_until_it_dies(path):
    """SIGSTOP past the lease TTL: the stopped process may resume on its GPU, so nobody else gets it."""
    holder = Holder(path, ttl=0.3)
    ledger = waiter(path, lease_ttl=0.3)
    os.kill(holder.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(AllocationTimeout):
            take_holders_gpu(ledger, timeout=1.5)          # 5 TTLs without a heartbeat
        assert any("stopped" in line for line in ledger.describe())
        holder.proc.kill()                          # dies while stopped
        holder.proc.wait()
        assert take_holders_gpu(ledger, timeout=5) < 1.0   # reclaimed within 1 s of its death
    finally:
        holder.kill()


def test_a_held_write_lock_reclaims_nothing_and_timeouts_still_hold(path):
    """Another connection holding the write lock stalls every heartbeat; no live lease is lost, and
    a waiter's timeout is kept while the lock is held."""
    holder = Holder(path, ttl=0.3)
    ledger = waiter(path, lease_ttl=0.3)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    start = time.monotonic()
    with pytest.raises(AllocationTimeout):
        ledger.allocate(ResourceRequest(gpus=0.5), timeout=0.4)
    # back at its timeout, not when the lock goes (it is held until after this) or SQLite's 30 s busy wait ends;
    # the bound leaves a loaded machine its scheduling delays (1.5 s seen)
    assert time.monotonic() - start < 5.0
    deadline = time.monotonic() + 1.0                # three TTLs of stalled heartbeats
    while time.monotonic() < deadline:
        blocker.execute("SELECT 1")
    blocker.execute("ROLLBACK")
    assert holder.lease_id in {p.lease_id for p in ledger.leases()}
    assert holder.say("check") == "held"
    with pytest.raises(AllocationTimeout):
        ledger.allocate(ResourceRequest(gpus=0.5), timeout=0.5)
    holder.kill()


_STOPPED_WRITER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")                 # the pool's write lock, then SIGSTOP from the test
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_writer_stopped_inside_its_transaction_costs_a_new_client_only_its_timeout(path):
    """A client SIGSTOPped while it holds the write lock freezes every write to the pool. A new client (its
    constructor and first request) still returns by the caller's timeout, with LedgerBusy naming the stopped
    process, which is also an AllocationTimeout to callers that only wait."""
    pool(path).close()
    writer = subprocess.Popen([sys.executable, "-c", _STOPPED_WRITER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "locked"
        os.kill(writer.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(LedgerBusy) as err:
            pool(path).allocate(ResourceRequest(gpus=1), timeout=2)
        assert time.monotonic() - start < 2 + 2.5                 # SQLite's own patience was 30 s, twice
        assert isinstance(err.value, AllocationTimeout)
        assert f"pid {writer.pid} (stopped" in str(err.value) and str(path) in str(err.value)
    finally:
        writer.kill()
        writer.wait()


def test_a_remote_holder_that_stops_heartbeating_is_fenced_and_told(path):
    """A holder on another host is judged by its heartbeat: once it expires the slice is re-granted,
    and the holder learns it when it resumes: its watcher fires, release is refused, check raises."""
    holder = Holder(path, ttl=0.6, host="elsewhere")
    ledger = waiter(path, lease_ttl=0.6)
    os.kill(holder.proc.pid, signal.SIGSTOP)
    try:
        assert take_holders_gpu(ledger, timeout=5) < 2.0
        os.kill(holder.proc.pid, signal.SIGCONT)
        lost = holder.proc.stdout.readline()
        assert lost.startswith("LOST") and "no heartbeat" in lost
        assert holder.say("release") == "released False"
        assert holder.say("check").startswith("LeaseLost")
    finally:
        holder.kill()


def new_pid_namespace() -> tuple[str, ...] | None:
    """The ``unshare`` command that runs a process in a new pid namespace here (as root, else in a user namespace
    mapping this user to root), killed with ``unshare``; None where neither works."""
    if shutil.which("unshare") is None:
        return None
    for extra in ((), ("--user", "--map-root-user")):
        prefix = ("unshare", *extra, "--pid", "--fork", "--mount-proc", "--kill-child")
        if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    return None


_WORKER_WITH_DAEMON = """
import os, subprocess, sys
from gpu.ledger import register_worker
from gpu.liveness import WORKER_MARK_ENV, process_start, worker_mark
os.setsid()                                   # what a task runner's worker does at start (tasks.runtime.workers)
os.environ[WORKER_MARK_ENV] = worker_mark(os.getpid(), process_start(os.getpid()))
register_worker(sys.argv[1], sys.argv[2])
# a task's daemon: a session of its own, out of the worker's tree once the worker dies
daemon = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
print(daemon.pid, flush=True)
sys.stdin.read()
"""


def test_what_a_dead_flows_worker_started_keeps_the_flows_slices(path):
    """The flow process and its registered worker both die, but a daemon a task started in the worker (a session
    of its own: only the worker's mark in its environment ties it to the worker) may still run on the flow's
    GPU: the slices stay held until it is gone too."""
    holder = Holder(path)
    worker = subprocess.Popen([sys.executable, "-c", _WORKER_WITH_DAEMON, str(path), holder.owner_key],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    daemon = int(worker.stdout.readline())
    try:
        ledger = waiter(path)
        holder.kill()
        worker.kill()
        worker.wait()
        with pytest.raises(AllocationTimeout):
            take_holders_gpu(ledger, timeout=1.0)
        os.kill(daemon, signal.SIGKILL)
        assert take_holders_gpu(ledger, timeout=5) < 1.0
    finally:
        for pid in (daemon, worker.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_released_slice_stays_held_while_what_its_task_left_lives(path):
    """A task ended but a process it started may still run on its GPU: ``release(linger=...)`` keeps the slice,
    held by that process, until it dies; then the slice is granted at once."""
    from gpu.liveness import process_start

    ledger = pool(path)
    left = ledger.allocate(ResourceRequest(gpus=1, label="left"), timeout=1)
    ledger.allocate(ResourceRequest(gpus=1), timeout=1)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = process_start(child.pid)
    try:
        assert ledger.release(left.lease_id, linger=[(child.pid, started)]) is True
        other = pool(path)
        with pytest.raises(AllocationTimeout):
            other.allocate(ResourceRequest(gpus=1), timeout=1.0)
        assert any(f"held by pid {child.pid}" in line for line in other.describe())
    finally:
        child.kill()
        child.wait()
    start = time.monotonic()
    again = other.allocate(ResourceRequest(gpus=1), timeout=5)
    assert again.devices == left.devices and time.monotonic() - start < 1.0
    assert other.release(again.lease_id, linger=[(child.pid, started)]) is True  # nothing left alive: freed now
    assert again.lease_id not in {p.lease_id for p in other.leases()}


def test_a_holder_in_another_pid_namespace_is_judged_by_heartbeat(path):
    """A container with host networking: our hostname, its own pids (the holder is pid 1 there, which is init
    here). Its pid cannot tell us whether it lives, so it is judged by heartbeat like another host's holder:
    kept while it heartbeats, re-granted once it is killed and its lease expires."""
    prefix = new_pid_namespace()
    if prefix is None:
        pytest.skip("no form of unshare can create a pid namespace on this machine")
    holder = Holder(path, ttl=3.0, prefix=prefix)
    try:
        assert holder.owner_key.split(":")[1] == "1"        # the fault: a pid from another namespace
        ledger = waiter(path, lease_ttl=3.0)
        with pytest.raises(AllocationTimeout):
            take_holders_gpu(ledger, timeout=1.5)           # judged by pid, it was re-granted at once
        assert holder.say("check") == "held"
        assert any("another pid namespace" in line for line in ledger.describe())
    finally:
        holder.kill()
    take_holders_gpu(ledger, timeout=15)                    # heartbeats stopped: the lease expires


def test_an_orphaned_worker_keeps_its_dead_flows_slices(path):
    """The flow process dies but a worker registered under it runs on: its slices stay held until the
    worker is gone too."""
    holder = Holder(path)
    worker = subprocess.Popen([sys.executable, "-c", "import sys; from gpu.ledger import register_worker; "
                               "register_worker(sys.argv[1], sys.argv[2]); print('up', flush=True); sys.stdin.read()",
                               str(path), holder.owner_key], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "up"
    ledger = waiter(path)
    holder.kill()
    with pytest.raises(AllocationTimeout):
        take_holders_gpu(ledger, timeout=1.0)
    worker.kill()
    worker.wait()
    assert take_holders_gpu(ledger, timeout=5) < 1.0


_STEPPED_CLOCK = """
import sys, time
real_time = time.time
time.time = lambda: real_time() + 3600        # this client's wall clock was stepped an hour ahead
from gpu.devices import PoolSpec, parse_simulated
from gpu.ledger import PoolLedger
PoolLedger(PoolSpec((parse_simulated("2x16GiB", "n0", cpus=8),)), sys.argv[1]).free_state()   # a reclaim pass
"""


def test_a_client_whose_clock_stepped_ahead_does_not_stop_reclaim(path):
    """A client an hour ahead stamps the pool's last reclaim in everyone else's future; a dead holder must
    still be reclaimed at once, not an hour later."""
    holder = Holder(path)
    ledger = waiter(path)
    subprocess.run([sys.executable, "-c", _STEPPED_CLOCK, str(path)], check=True, timeout=60)
    with sqlite3.connect(path) as db:
        stamped = float(db.execute("SELECT value FROM meta WHERE key='last_reclaim'").fetchone()[0])
    assert stamped > time.time() + 3000                 # the fault is in the file
    holder.kill()
    take_holders_gpu(ledger, timeout=5)                 # AllocationTimeout if reclaim waited for the stamp


@pytest.mark.parametrize("wipe", ["truncate", "delete", "delete-with-lock"])
def test_a_wiped_pool_file_is_refused_while_its_holders_live(path, wipe):
    """Deleting or truncating the pool file under a live holder must not start an empty pool."""
    holder = Holder(path)
    try:
        if wipe == "truncate":
            path.write_bytes(b"")
        else:
            path.unlink()
            if wipe == "delete-with-lock":
                Path(f"{path}.lock").unlink()
        with pytest.raises(LedgerReplaced, match=str(path)) as err:
            pool(path)
        assert str(holder.proc.pid) in str(err.value) or wipe == "truncate"
        assert holder.say("check").startswith(("LedgerReplaced", "LeaseLost"))
    finally:
        holder.kill()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    assert pool(path).allocate(ResourceRequest(gpus=1), timeout=1).devices == (0,)   # no holder left: a fresh pool


@pytest.mark.parametrize("restore", ["copy-over", "replace"])
def test_a_pool_file_restored_from_an_older_copy_is_refused_while_its_holders_live(path, tmp_path, restore):
    """A copy taken while the pool was idle is put back (over the file, or renamed over it) without its -wal and
    -shm while a holder lives: its lease is not in the copy, so opening the pool must not grant its GPU again."""
    pool(path).close()                                    # idle: every commit is in the file itself
    backup = tmp_path / "backup.sqlite"
    shutil.copyfile(path, backup)
    holder = Holder(path)
    try:
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink()
        if restore == "copy-over":
            shutil.copyfile(backup, path)                     # the same inode, older contents
        else:
            shutil.copyfile(backup, tmp_path / "restoring")
            os.replace(tmp_path / "restoring", path)
        with pytest.raises(LedgerReplaced, match=str(path)) as err:
            pool(path).allocate(ResourceRequest(gpus=2), timeout=1)
        assert str(holder.proc.pid) in str(err.value) and "older copy" in str(err.value)
    finally:
        holder.kill()
    assert len(pool(path).allocate(ResourceRequest(gpus=2), timeout=1).devices) == 2   # no holder left: it is the pool


_REAL_LIKE_POOL = """
import sys
from gpu.devices import Device, Node, PoolSpec
from gpu.pool import open_pool
gpus = tuple(Device(i, f"GPU-{sys.argv[1]}-{i}", "NVML-like GPU", 2**34, 2**34) for i in range(2))  # not simulated
ledger = open_pool("default", spec=PoolSpec((Node("n0", gpus, 8.0),)))
print("opened", ledger.path, flush=True)
sys.stdin.read()
"""


def test_one_gpu_has_one_ledger_on_a_machine_whatever_the_state_folder(tmp_path):
    """The state folder defaults to ./.state: two working directories opening the same GPUs (two processes with
    two state folders, devices with the same UUIDs) must not make two ledgers that each grant them whole."""
    tag = os.urandom(4).hex()

    def run_in(state: str, **kw) -> subprocess.Popen:
        env = {**os.environ, "GPUFLOWS_STATE_DIR": str(tmp_path / state),
               "GPUFLOWS_DEVICE_REGISTRY": str(tmp_path / "registry")}
        return subprocess.Popen([sys.executable, "-c", _REAL_LIKE_POOL, tag], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

    first = run_in("a")
    try:
        assert first.stdout.readline().startswith("opened")
        out, err = run_in("b").communicate("", timeout=60)
        assert "ConfigError" in err and f"belong to the ledger {tmp_path / 'a' / 'pools' / 'default.sqlite'}" in err
        assert f"GPU-{tag}-0" in err and str(first.pid) in err and not out
    finally:
        first.kill()
        first.wait()
    out, err = run_in("b").communicate("", timeout=60)  # its ledger is no longer in use: the GPUs move
    assert out.startswith(f"opened {tmp_path / 'b'}"), err


def test_a_request_for_a_resource_nobody_created_waits_off_the_head(path):
    """ESCHER's signalling (P2): the consumer queued before the producer does not block the pool."""
    ledger = pool(path)
    consumer = ledger.submit(ResourceRequest(resources={"signal-t1": 1}, label="t2"))
    producer = ledger.allocate(ResourceRequest(gpus=0.5, label="t1"), timeout=1)        # behind it in the queue
    assert producer.label == "t1" and ledger.try_grant(consumer) is None
    ledger.set_resource("signal-t1", 1)
    assert ledger.try_grant(consumer).label == "t2"


def test_resource_names_must_be_non_empty_strings():
    ledger = pool(None)
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="resource name"):
            ledger.set_resource(bad, 1)


def test_a_worker_registers_only_in_an_existing_pool(tmp_path):
    with pytest.raises(LedgerError, match="register a worker"):
        register_worker(str(tmp_path / "missing.sqlite"), "host:1:tok")


def test_fencing_check_names_the_lease_and_the_reason(path):
    ledger = pool(path)
    placement = ledger.allocate(ResourceRequest(gpus=0.5, label="fenced"), timeout=1)
    ledger.check(placement)
    assert ledger.release(placement.lease_id)
    with pytest.raises(LeaseLost, match="fenced"):
        ledger.check(placement)


def test_threads_waiting_behind_a_held_lock_time_out_and_leave_nothing_behind(path):
    """Many threads of one process share write transactions (group commit). Behind another process's
    held write lock each keeps its own timeout, and a request that timed out was never written: once
    the lock frees, no ticket or lease of theirs is in the pool and the pool grants as before."""
    import threading

    ledger = pool(path)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    outcomes: list[str] = []

    def ask(timeout: float) -> None:
        try:
            ledger.allocate(ResourceRequest(gpus=0.25), timeout=timeout)
            outcomes.append("granted")
        except AllocationTimeout:
            outcomes.append(f"timeout after {timeout}")

    threads = [threading.Thread(target=ask, args=(0.2 + 0.05 * (i % 4),)) for i in range(8)]
    start = time.monotonic()
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert time.monotonic() - start < 3.0  # each its own timeout, not SQLite's 30 s busy wait
    assert all(o.startswith("timeout") for o in outcomes) and len(outcomes) == 8
    blocker.execute("ROLLBACK")
    assert ledger.leases() == [] and ledger.waiting() == 0
    granted = [ledger.allocate(ResourceRequest(gpus=0.25), timeout=5.0) for _ in range(8)]
    assert len({(p.devices, p.lease_id) for p in granted}) == 8  # the whole pool, as if nothing happened
