"""Shared test set-up: every run gets its own Prefect home, state folder and MLflow store.

The environment is set at import time, before Prefect, Ray or MLflow read their settings.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

_ROOT = Path(tempfile.mkdtemp(prefix="gpuflows-tests-"))
os.environ.update({
    "GPUFLOWS_STATE_DIR": str(_ROOT / "state"),
    "PREFECT_HOME": str(_ROOT / "prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
})


# Tests that start a Prefect server, Ray, or real processes under faults: `make test-fast` leaves them out.
_SLOW_FIXTURES = {"prefect_server", "real_server"}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if _SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def prefect_server():
    """One Prefect server for the session; its URL is exported so worker processes (process
    pools, Ray workers) report to it instead of starting servers of their own."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
        yield PREFECT_API_URL.value()
        os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    """A fresh state folder (pool ledgers, MLflow database) for one test."""
    monkeypatch.setenv("GPUFLOWS_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture(scope="session")
def state_folder(tmp_path_factory):
    """``with state_folder("ekya"):`` runs the block on a fresh state folder (pool ledgers, the default MLflow
    store): what ``state_dir`` does for one test, for a module-scoped fixture whose flow runs several tests
    read back (a function-scoped ``monkeypatch`` cannot serve it)."""

    @contextmanager
    def folder(name: str):
        path = tmp_path_factory.mktemp(name)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("GPUFLOWS_STATE_DIR", str(path))
            yield path

    return folder


@pytest.fixture(scope="session")
def sim_pool():
    """``sim_pool("name")``: a pool block on simulated devices (default two 16 GiB GPUs), nothing saved."""
    from resource_blocks import GpuPool

    def pool(name: str, spec: str = "2x16GiB") -> GpuPool:
        return GpuPool(name=name, device_backend="simulated", simulated=spec)

    return pool


@pytest.fixture(scope="session")
def tiny_ekya() -> dict:
    """The Ekya flow's smallest run that still retrains: 2 streams, 2 windows, workers as threads."""
    return dict(streams=2, windows=2, frames=300, labelled=200, mode="thread")



@pytest.fixture
def table_artifacts():
    """Reads the table artifacts published under a key on the test Prefect server: their rows, newest first."""
    import json

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    def read(key: str) -> list[list[dict]]:
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                          sort=ArtifactSort.CREATED_DESC)
        return [json.loads(a.data) for a in found]

    return read
