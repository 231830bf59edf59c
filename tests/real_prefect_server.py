"""``prefect server start`` as a user runs it, for the tests that need a real server (deployments, workers, the
README's commands): started on a free port, waited for until healthy, stopped at the end."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

PREFECT = str(Path(sys.executable).with_name("prefect"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def real_prefect_server(port: int, env: dict, cwd: Path, log_path: Path, timeout_s: float = 180) -> Iterator[str]:
    """The server on ``port`` with ``env`` (its home, its settings), its output in ``log_path``; yields its API URL
    once ``/api/health`` answers (a test fails, with the log's tail, if it exits or takes over ``timeout_s``)."""
    url = f"http://127.0.0.1:{port}/api"
    with open(log_path, "w") as log:
        server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                  cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while not _healthy(url):
                if server.poll() is not None:
                    pytest.fail("prefect server exited:\n" + log_path.read_text()[-3000:])
                if time.monotonic() > deadline:
                    pytest.fail(f"prefect server not healthy in {timeout_s:.0f} s:\n" + log_path.read_text()[-3000:])
                time.sleep(0.5)
            yield url
        finally:
            stop(server)


def stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace_s`` (a server or worker the tests started)."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
