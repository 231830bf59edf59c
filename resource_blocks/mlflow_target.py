"""Where flows and task runners record runs in MLflow."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field

from gpu.state import state_dir
from resource_blocks._defaults import load_or_default


def default_tracking_uri() -> str:
    """Where runs go when no tracking server is named: SQLite in the project's state folder (``gpu.state``)."""
    return f"sqlite:///{state_dir() / 'mlflow.db'}"


class MlflowTarget(Block):
    """MLflow tracking server and experiment; defaults to SQLite in the project's state folder
    (never the ``./mlruns`` file store)."""

    _block_type_name = "gpuflows MLflow target"
    _description = "MLflow tracking URI and experiment for gpuflows runs."

    tracking_uri: str | None = Field(default=None, description="None: sqlite:///<state>/mlflow.db")
    experiment: str = Field(default="gpuflows", description="Experiment that flow runs log to.")
    enabled: bool = Field(default=True, description="Switch tracking off entirely.")

    @classmethod
    def load_or_default(cls, name: str | None = None) -> "MlflowTarget":
        return load_or_default(cls, name)

    def resolved_uri(self) -> str:
        return self.tracking_uri or default_tracking_uri()
