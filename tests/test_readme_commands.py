"""The README's deployment commands copied as written, in a fresh shell (no ``PREFECT_HOME``, no ``PREFECT_API_URL``
until the README exports it) of a checkout, against a temporary ``prefect server start``; then what prefect.yaml
promises there: a schedule never overlaps itself, the serving rollouts queue one at a time.

``prefect deployment run 'pool-demo/pool-demo'`` once failed with "not found" (the export was in prose below it) and
``prefect block register -m resource_blocks`` registered into a temporary server of ``~/.prefect``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real_prefect_server import free_port, real_prefect_server

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # what `source .venv/bin/activate` puts on PATH
pytestmark = pytest.mark.slow


def readme_commands() -> list[str]:
    """The shell lines of the README's "Deployments" section, comments stripped, in the order a user types them: the
    "by hand" block's set-up (what ``make server``/``make deploy`` run, minus the server and the worker, which this
    test starts or does without), then the quick block's ``export`` and ``prefect`` lines."""
    section = ROOT.joinpath("README.md").read_text().split("## Deployments", 1)[1].split("\n## ", 1)[0]
    quick, by_hand = [[re.sub(r"\s+#.*$", "", line).strip() for line in block.strip().splitlines()]
                      for block in re.findall(r"```bash\n(.*?)```", section, re.S)[:2]]
    setup = [c for c in by_hand if not c.startswith(("prefect server start", "prefect worker start"))]
    return setup + [c for c in quick if c.startswith(("export ", "prefect "))]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A checkout as a user has it after ``make demo``: the project, its pyproject.toml and prefect.yaml, and a
    ``.state/prefect`` home; a shell environment with nothing of Prefect's or gpuflows' set, HOME empty."""
    root = tmp_path_factory.mktemp("checkout")
    for name in ("flows", "tasks", "gpu", "resource_blocks", "gpuflows", "scenarios"):
        (root / name).symlink_to(ROOT / name)
    for name in ("pyproject.toml", "prefect.yaml"):
        shutil.copy(ROOT / name, root / name)
    (root / ".state" / "prefect").mkdir(parents=True)
    home = root.parent / f"{root.name}-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "GPUFLOWS_"))}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(root),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", MLFLOW_DISABLE_TELEMETRY="true")
    return root, home, env


@pytest.fixture(scope="module")
def server(checkout):
    """``make server``: ``prefect server start`` on the checkout's home (the port free, not 4200)."""
    root, _, env = checkout
    port = free_port()
    with real_prefect_server(port, {**env, "PREFECT_HOME": str(root / ".state" / "prefect"),
                                    "PREFECT_SERVER_API_PORT": str(port)}, root, root / "server.log") as url:
        yield port, url


@pytest.fixture(scope="module")
def ran(checkout, server):
    """The README's commands, as written (the port swapped for the test server's), in one bash in the checkout."""
    root, _, env = checkout
    port, _ = server
    script = "\n".join(c.replace("4200", str(port)) for c in readme_commands())
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=root, env=env, capture_output=True,
                          text=True, timeout=540)
    return done


def test_the_readme_deployment_commands_work_as_written(checkout, server, ran):
    from prefect.client.orchestration import SyncPrefectClient

    root, home, _ = checkout
    assert readme_commands()[-1].startswith("prefect deployment run 'pool-demo/pool-demo'")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "Created flow run" in ran.stdout
    with SyncPrefectClient(server[1]) as client:
        demo = client.read_deployment_by_name("pool-demo/pool-demo")
        (flow_run,) = [r for r in client.read_flow_runs() if r.deployment_id == demo.id]  # the schedules' aside
        assert flow_run.parameters["tasks"] == 4
        slugs = {b.slug for b in client.read_block_types()}
        assert {"gpuflows-gpu-pool", "gpuflows-mlflow-target", "gpuflows-scheduler-policy"} <= slugs
    assert not (home / ".prefect").exists()  # nothing went to ~/.prefect


def test_a_schedule_never_overlaps_itself_and_serving_rollouts_queue(server, ran):
    """Cilantro's 120 s schedule once ran 384-507 s rounds on a loaded machine: 5 of 7 runs failed on the run's
    lock. Now each schedule has a concurrency limit whose second run is cancelled (skip if running), and the serving
    rollouts, which each hold whole nodes for their whole trace, share a work queue that runs one at a time."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.states import Pending, Running

    assert ran.returncode == 0
    with SyncPrefectClient(server[1]) as client:
        deployments = {d.name: d for d in client.read_deployments()}
        for name, d in deployments.items():
            if d.schedules:
                assert d.global_concurrency_limit.limit == 1, name
                assert d.concurrency_options.collision_strategy == "CANCEL_NEW", name
                interval = d.schedules[0].schedule.interval.total_seconds()
                assert interval >= 600 or name != "cilantro-allocation-rounds", "a round's run takes minutes"
        cilantro = deployments["cilantro-allocation-rounds"]
        first, second = (client.create_flow_run_from_deployment(cilantro.id) for _ in range(2))
        client.set_flow_run_state(first.id, Pending())
        client.set_flow_run_state(first.id, Running())
        client.set_flow_run_state(second.id, Pending())  # what a worker proposes when the schedule fires again
        assert client.read_flow_run(second.id).state.is_cancelled()
        assert client.read_flow_run(first.id).state.is_running()
        queues = {d.work_queue_name for n, d in deployments.items() if n.startswith("serving-rollout")}
        assert queues == {"serving"}
        assert client.read_work_queue_by_name("serving", work_pool_name="gpuflows").concurrency_limit == 1
