"""The live Salus executors of a pool, as ``gpuflows pool`` shows them: lanes, jobs and who holds each token.

An executor (``tasks.salus.executor.SalusExecutor``) lives inside a flow's process; the pool's ledger only knows
that it leases a device whole. So while it runs, the executor registers its token service's address under the
state folder (``salus/<pool>/``), and answers ``status`` there with one JSON line (``ExecutorStatus``); a reader
in another process asks each registered executor. An entry whose executor is gone (its socket refuses) is
skipped and, if its process has died, removed.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any

from gpu.liveness import process_alive
from gpu.pool import pool_path
from gpu.state import state_dir

ASK_TIMEOUT_S = 2.0  # an executor answers from memory under its lock: a stuck one is reported, not waited for
PROCESS_STATES = {"T": "stopped", "t": "stopped by a tracer", "Z": "exited", "X": "exited", "": "gone"}


def process_word(state: str) -> str:
    """A ``/proc`` state letter (``gpu.liveness.process_state``) in words: stopped, exited, gone or running."""
    return PROCESS_STATES.get(state, "running")


def _folder(pool: str) -> Path:
    pool_path(pool)  # the same name rules as the pool's ledger
    return state_dir() / "salus" / pool


def register(pool: str, device: int, address: str) -> Path:
    """Record a running executor of ``pool``'s ``device`` answering on ``address``; returns the entry to remove."""
    folder = _folder(pool)
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / f"gpu{device}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    entry.write_text(json.dumps({"device": device, "socket": address, "pid": os.getpid()}))
    return entry


def ask_status(address: str, timeout: float = ASK_TIMEOUT_S) -> dict[str, Any]:
    """One executor's status (raises OSError or ValueError when it does not answer)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(address)
        sock.sendall(b"status\n")
        with sock.makefile("r") as reader:
            return json.loads(reader.readline())


def executors(pool: str) -> list[dict[str, Any]]:
    """The status of every live executor of ``pool``, by device; an executor that does not answer is named with
    ``error`` instead (stuck), or dropped if its process is gone."""
    out = []
    for entry in sorted(_folder(pool).glob("*.json")):
        try:
            reg = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        try:
            out.append(ask_status(reg["socket"]))
        except (OSError, ValueError) as exc:
            if not process_alive(int(reg.get("pid", 0)), 0):
                entry.unlink(missing_ok=True)
                continue
            out.append({"device": reg.get("device"), "pid": reg.get("pid"), "error": f"does not answer ({exc})"})
    return sorted(out, key=lambda s: (s.get("device") is None, s.get("device")))


def describe(status: dict[str, Any]) -> list[str]:
    """An executor's status as ``gpuflows pool`` prints it: a head line, then one line per lane with its token."""
    head = f"salus gpu{status.get('device')} (executor pid {status.get('pid')})"
    if "error" in status:
        return [f"{head}: {status['error']}"]
    lines = [f"{head}: policy {status['policy']}, {len(status['lanes'])} lane(s), {status['jobs']} job(s) admitted, "
             f"{len(status['queue'])} queued, {status['used_mb']:.0f} of {status['usable_mb']:.0f} MB charged (Eq. 2.1)"]
    for lane in status["lanes"]:
        line = (f"  lane {lane['lane']}: {lane['size_mb']:.0f} MB, jobs {', '.join(lane['jobs']) or '-'}"
                + (" [fenced]" if lane["fenced"] else "") + ("" if lane["in_place"] else " [waiting to slide]"))
        hold = lane["holder"]
        if hold is None:
            line += "; token free"
        else:
            line += (f"; token: {hold['job']} for {hold['held_s']:.1f} s (bound {hold['bound_s']:.1f} s)"
                     + (", REVOKED past its bound" if hold["revoked"] else "")
                     + (f", process {hold['pid']} {hold['process']}" if hold.get("pid") else ""))
        lines.append(line)
    for r in status.get("revoked", [])[-5:]:
        lines.append(f"  revoked: {r['job']} held lane {r['lane']}'s token {r['held_s']:.1f} s > bound "
                     f"{r['bound_s']:.1f} s at {r['at_s']:.1f} s (process {r['process']})")
    return lines
