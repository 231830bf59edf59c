"""`gpuflows pool`: a pool opens with the layout its ledger stores, an unknown name is an error, `--list` lists them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from gpu.pool import open_pool, pool_names, read_pool
from gpu.placement import ResourceRequest
from gpuflows.cli import main


def test_looking_at_an_idle_pool_keeps_its_layout(state_dir, capsys):
    open_pool("big", simulated="4x8GiB").close()
    assert main(["pool", "--name", "big"]) == 0
    out = capsys.readouterr().out
    assert "gpu3: compute 1.00 free, memory 8GiB/8GiB free" in out and "16GiB" not in out
    assert ": 4 x 8GiB, " in read_pool("big").layout()


def test_a_misspelt_pool_name_is_an_error_listing_the_pools_and_creates_nothing(state_dir, capsys):
    open_pool("big", simulated="4x8GiB").close()
    assert main(["pool", "--name", "bgi"]) == 2
    err = capsys.readouterr().err
    assert "pool='bgi': no such pool; the pools here are ['big']" in err and "Traceback" not in err
    assert pool_names() == ["big"]


def test_the_pool_list_shows_layouts_and_leases(state_dir, capsys):
    assert main(["pool", "--list"]) == 0
    assert "no pools yet" in capsys.readouterr().out
    ledger = open_pool("demo", simulated="2x16GiB")
    lease = ledger.allocate(ResourceRequest(gpus=0.5), timeout=5)
    open_pool("big", simulated="4x8GiB").close()
    assert main(["pool", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["big", "demo"]
    assert "4 x 8GiB" in lines[0] and "0 lease(s), 0 waiting" in lines[0]
    assert "2 x 16GiB" in lines[1] and "1 lease(s), 0 waiting" in lines[1]
    ledger.release(lease.lease_id)
    ledger.close()


_ON_A_READ_ONLY_FOLDER = """
import os, sys
from gpu.errors import LedgerError
from gpu.pool import open_pool
from gpuflows.cli import main
print("pool", main(["pool", "--name", "demo"]), flush=True)
try:
    open_pool("fresh", simulated="1x16GiB", backend="simulated")
except LedgerError as exc:
    print("fresh", type(exc).__name__, exc, flush=True)
os.environ["GPUFLOWS_STATE_DIR"] = os.path.join(os.environ["GPUFLOWS_STATE_DIR"], "missing")
print("list", main(["pool", "--list"]), flush=True)
"""


def read_only(folder: Path) -> tuple[list[str], Callable[[], None]]:
    """The command prefix that runs a process with ``folder`` read-only, and what undoes it. Root writes through
    any mode bits, so as root the folder is bind-mounted read-only in the process's own mount namespace (EROFS);
    as another user its mode bits and its files' lose write permission (EACCES)."""
    if os.geteuid() != 0:
        paths = [folder, *folder.rglob("*")]
        for p in paths:
            p.chmod(p.stat().st_mode & ~0o222)
        return [], lambda: [p.chmod(p.stat().st_mode | 0o200) for p in paths]
    prefix = ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"',
              str(folder)]
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root, and no read-only bind mount can be made here")
    return prefix, lambda: None


def test_a_read_only_state_folder_is_a_ledger_error_not_a_traceback(state_dir):
    """The pool in use (its -wal and -shm exist, so it can be read) but its folder read-only for the caller:
    `gpuflows pool` and opening a new pool name the file and say it is read-only, and a state folder that
    cannot be created is a configuration error, never an OSError's traceback."""
    held = open_pool("demo", simulated="2x16GiB", backend="simulated")
    held.allocate(ResourceRequest(gpus=1), timeout=5)
    prefix, undo = read_only(state_dir)
    try:
        out = subprocess.run([*prefix, sys.executable, "-c", _ON_A_READ_ONLY_FOLDER], capture_output=True, text=True,
                             timeout=120)
    finally:
        undo()
        held.close()
    assert "Traceback" not in out.stderr and out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    demo = state_dir / "pools" / "demo.sqlite"
    assert lines["pool"] == "2" and f"pool ledger {demo}: could not open the pool" in out.stderr
    assert "read-only" in out.stderr or "not writable" in out.stderr
    assert lines["fresh"].startswith(f"LedgerError pool ledger {state_dir / 'pools' / 'fresh.sqlite'}")
    assert lines["list"] == "2" and "GPUFLOWS_STATE_DIR=" in out.stderr and "cannot be created" in out.stderr
