"""prefect.yaml registers against a real `prefect server start`, and the blocks register too."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect-home")),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "GPUFLOWS_HOME": str(ROOT)}
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, "prefect server exited"
            time.sleep(0.5)
        else:
            pytest.fail("prefect server did not become healthy in 120 s")
        yield env
    finally:
        server.terminate()
        server.wait(30)


def run(args: list[str], env: dict) -> str:
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_every_deployment_in_prefect_yaml_registers(real_server):
    run([PREFECT, "work-pool", "create", "gpuflows", "--type", "process"], real_server)
    run([PREFECT, "--no-prompt", "deploy", "--all"], real_server)
    listed = run([PREFECT, "deployment", "ls"], real_server)
    names = [d["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]]
    assert names and all(name in listed for name in names)


def test_blocks_register_with_the_prefect_cli(real_server):
    out = run([PREFECT, "block", "register", "-m", "resource_blocks"], real_server)
    for block in ("gpuflows GPU pool", "gpuflows MLflow target", "gpuflows scheduler policy"):
        assert block in out


def test_every_flow_module_has_a_cli_with_help():
    for entry in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        module = "flows." + Path(entry["entrypoint"].split(":")[0]).stem
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), (module, done.stderr[-2000:])
