"""One ledger per GPU on a machine: which pool file holds which real devices.

A pool's ledger is a file under the state folder, which defaults to ``./.state``: two working directories
(or two pool names) on the same GPUs made two ledgers, and each granted the GPUs whole. So a pool file on
real (NVML) devices claims their UUIDs in a registry every process of the machine reads, one small file
per device naming the ledger that owns it, and a second ledger on a claimed device is refused while the
owner is in use (a live client holds its lock). An owner nobody uses any more (its clients ended, its file
deleted) hands its devices to the next ledger that opens them. Simulated devices are never claimed: each
simulated pool is a world of its own.

The registry lives in ``GPUFLOWS_DEVICE_REGISTRY``, default ``/dev/shm/gpuflows-devices`` (shared by every
user and every service's private /tmp; emptied at boot, when every claim's process is gone anyway).
Containers sharing GPUs share a registry only where they mount the same folder there.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from gpu.errors import ConfigError, LedgerError
from gpu.ledger_file import LedgerFile
from gpu.liveness import processes_holding

REGISTRY_ENV = "GPUFLOWS_DEVICE_REGISTRY"


def registry_dir() -> Path:
    """Where the claims of this machine's devices are kept (``GPUFLOWS_DEVICE_REGISTRY`` overrides it)."""
    shared = Path("/dev/shm")
    default = (shared if shared.is_dir() else Path(tempfile.gettempdir())) / "gpuflows-devices"
    return Path(os.environ.get(REGISTRY_ENV) or default)


def claim_devices(uuids: Iterable[str], ledger: str) -> None:
    """Record pool file ``ledger`` as the one ledger of devices ``uuids``.

    ConfigError naming the other ledger when one in use owns any of them; nothing is claimed then.
    """
    uuids = sorted(set(uuids))
    if not uuids:
        return
    folder = registry_dir()
    try:
        with _registry_locked(folder):
            owners = {u: _owner(folder / _file_name(u)) for u in uuids}
            taken = {o for o in owners.values() if o and o != ledger and _in_use(LedgerFile(o).lock_path)}
            if taken:
                other = sorted(taken)[0]
                raise _refusal(ledger, other, [u for u, o in owners.items() if o == other])
            for u, o in owners.items():
                if o != ledger:
                    _write_owner(folder / _file_name(u), ledger)
    except OSError as exc:
        raise LedgerError(f"pool ledger {ledger}: could not claim its devices in the registry {folder}: "
                          f"{exc.strerror} ({exc.filename})") from exc


def _refusal(ledger: str, other: str, uuids: list[str]) -> ConfigError:
    """Why ``ledger`` may not open devices ``uuids``: they belong to ``other``, in use by the pids named."""
    pids = processes_holding([LedgerFile(other).lock_path])
    return ConfigError("pool", ledger, f"its devices {', '.join(uuids)} belong to the ledger {other}, in use (pids "
                                       f"{', '.join(map(str, pids[:8])) or 'unknown'}): one ledger per GPU on a "
                                       "machine, or both grant it whole. Use that pool (its state folder and name), "
                                       "or stop its clients first")


@contextmanager
def _registry_locked(folder: Path) -> Iterator[None]:
    """The registry, exclusively: two ledgers claiming the same device at once cannot both win."""
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o1777)  # every user's ledgers claim here; the sticky bit keeps each claim its owner's
    fd = os.open(folder / ".lock", os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access: any user may
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _file_name(uuid: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", uuid)


def _owner(claim: Path) -> str:
    try:
        return claim.read_text().strip()
    except FileNotFoundError:
        return ""


def _write_owner(claim: Path, ledger: str) -> None:
    staged = claim.with_name(f".{claim.name}.{os.getpid()}")
    staged.write_text(ledger + "\n")
    staged.chmod(0o644)
    os.replace(staged, claim)


def _in_use(lock_path: str) -> bool:
    """Whether a live client holds the ledger whose lock file is ``lock_path`` (every client holds it shared)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
