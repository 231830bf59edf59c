"""Who may still be using a slice: processes, their liveness, and open handles to a file.

The ledger frees a slice only when no process that may run on it is alive. Within one pid space
that is decided from ``/proc`` (pid plus the kernel's start time, so a reused pid is not mistaken for
the holder); a heartbeat expiry is only trusted for holders whose pids this process cannot read:
on other hosts, or on this host in another pid namespace (a container with host networking has our
hostname, but its pid 1 is not ours), or from before a reboot.

A task runner's worker process is judged with everything it started (``live_groups``): a task's own
subprocess, even a double-forked daemon, may run on the worker's slice after the worker is gone.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

HOST = socket.gethostname()


def pid_space() -> str:
    """Which pids this process sees: the kernel's boot id and the (device, inode) of its pid namespace.

    Two processes may judge each other by pid only when these are equal: the hostname alone is shared by
    containers with host networking (each with its own pid namespace) and survives a reboot (a new boot
    reuses every pid). Empty parts where ``/proc`` lacks them (then equal for every process of the host).
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        ns = os.stat("/proc/self/ns/pid")
        namespace = f"{ns.st_dev}:{ns.st_ino}"
    except OSError:
        namespace = ""
    return f"{boot}/{namespace}"


PID_SPACE = pid_space()


def pids_visible(host: str, space: str | None) -> bool:
    """Whether a process recorded as on ``host`` in pid space ``space`` can be judged by its pid from here."""
    return host == HOST and space == PID_SPACE


def process_start(pid: int) -> int:
    """Kernel start time of ``pid`` (guards against pid reuse); 0 where /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def process_alive(pid: int, pstart: int) -> bool:
    """True while ``pid`` (started at ``pstart``) exists and is not a zombie.

    A stopped process (SIGSTOP) is alive: it may resume on its GPU at any moment.
    """
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


WORKER_MARK_ENV = "GPUFLOWS_WORKER"
"""A worker process's mark in its environment (``worker_mark``), inherited by every program it starts."""


def worker_mark(pid: int, pstart: int) -> str:
    """The value of ``WORKER_MARK_ENV`` in worker ``pid`` (started at ``pstart``) and what it starts."""
    return f"{pid}:{pstart}"


def _stat_fields(entry: Path) -> list[str] | None:
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # it exited meanwhile


def group_members(groups: Iterable[tuple[int, int]]) -> dict[tuple[int, int], list[int]]:
    """The live processes of each worker group ``(pid, pstart)``, in one pass over ``/proc``.

    A worker leads a session of its own (``os.setsid`` at start) and carries ``WORKER_MARK_ENV`` in its
    environment. Its group is the worker itself, every process of its session (all it starts, forked or
    executed, unless a process leaves the session) and every process whose environment carries its mark
    (a program executed after leaving the session: a double-forked daemon, ``start_new_session=True``).
    Only a program that both leaves the session and starts from a cleared environment escapes it.
    Linux keeps a session's id allocated while any member lives, so a live process with the worker's pid
    but another start time means the session is gone and its number reused: no member then comes from
    the session. Zombies are dead. Processes this user may not inspect are not seen.
    """
    wanted = {tuple(g): [] for g in groups}
    if not wanted:
        return {}
    marks = {f"{WORKER_MARK_ENV}={worker_mark(*g)}".encode(): g for g in wanted}
    oldest = min(start for _, start in wanted)
    by_session: dict[int, list[tuple[int, int]]] = {}
    for pid, start in wanted:
        by_session.setdefault(pid, []).append((pid, start))
    reused: set[tuple[int, int]] = set()
    in_session: dict[tuple[int, int], list[int]] = {g: [] for g in wanted}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        pid, session, start = int(entry.name), int(fields[3]), int(fields[19])
        for g in by_session.get(pid, ()):
            if start == g[1]:
                wanted[g].append(pid)
            else:
                reused.add(g)
        for g in by_session.get(session, ()):
            if pid != g[0] and start >= g[1]:
                in_session[g].append(pid)
        if start < oldest or session in by_session:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for mark, g in marks.items():
            if mark in environ and start >= g[1] and pid != g[0]:
                wanted[g].append(pid)
    for g, pids in in_session.items():
        if g not in reused:
            wanted[g] += pids
    return {g: sorted(set(pids)) for g, pids in wanted.items()}


def live_groups(groups: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """Which worker groups ``(pid, pstart)`` still have a live process (``group_members``)."""
    return {g for g, pids in group_members(groups).items() if pids}


def process_state(pid: int) -> str:
    """One-letter state of ``pid`` from /proc (R, S, T for stopped, Z, ...), '' if unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


@dataclass(frozen=True)
class Owner:
    """Who holds a lease or a ticket: a process on a host in a pid space (plus a token per ledger client)."""

    host: str
    pid: int
    pstart: int
    token: str
    space: str = ""

    @classmethod
    def this_process(cls) -> "Owner":
        pid = os.getpid()
        return cls(HOST, pid, process_start(pid), uuid.uuid4().hex[:8], PID_SPACE)

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}:{self.token}"


def processes_holding(paths: Iterable[str | Path]) -> list[int]:
    """Pids of other live processes with one of ``paths`` open, also when the file was deleted.

    Used only when a pool file looks new: a live client still holding the old (deleted) file proves
    the pool was wiped under it. Only processes this user may inspect are seen.
    """
    wanted = set()
    for p in paths:
        p = os.path.abspath(p)
        wanted |= {p, f"{p} (deleted)"}
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    found.append(int(entry.name))
                    break
            except OSError:
                continue
    return sorted(found)


def lock_holders(path: str | Path, offset: int) -> list[int]:
    """Pids holding a POSIX write lock on byte ``offset`` of ``path`` (``/proc/locks``: SQLite's locks are POSIX
    record locks); empty when none, or where ``/proc/locks`` or the file is unavailable."""
    try:
        st = os.stat(path)
        table = Path("/proc/locks").read_text()
    except OSError:
        return []
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in table.splitlines():
        fields = line.split()  # "1: POSIX  ADVISORY  WRITE 12563 fe:00:2156219 120 120"; "->" marks a waiter
        if len(fields) == 8 and fields[1] == "POSIX" and fields[3] == "WRITE" and fields[5] == where:
            end = fields[7]
            if int(fields[6]) <= offset and (end == "EOF" or offset <= int(end)):
                pids.append(int(fields[4]))
    return pids
