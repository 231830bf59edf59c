"""Where flows and task runners record runs in MLflow."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field

from gpu.state import state_dir
from resource_blocks._defaults import load_or_default


DEFAULT_EXPERIMENT = "gpuflows"
"""The experiment of a run no system claims (a user's own flow on ``GpuTaskRunner``); every gpuflows flow logs to
its system's ``gpuflows-<system>`` (``tasks.runtime.flow.RunIdentity``)."""


def default_tracking_uri() -> str:
    """Where runs go when no tracking server is named: SQLite in the project's state folder (``gpu.state``)."""
    return f"sqlite:///{state_dir() / 'mlflow.db'}"


class MlflowTarget(Block):
    """MLflow tracking server and experiment; defaults to SQLite in the project's state folder
    (never the ``./mlruns`` file store)."""

    _block_type_name = "gpuflows MLflow target"
    _description = "MLflow tracking URI and experiment for gpuflows runs."

    tracking_uri: str | None = Field(default=None, description="None: sqlite:///<state>/mlflow.db")
    experiment: str | None = Field(default=None, description="Experiment that flow runs log to; None: the flow's "
                                   "system's own (gpuflows-ekya, gpuflows-nona, ...), whatever the entry point.")
    enabled: bool = Field(default=True, description="Switch tracking off entirely.")

    @classmethod
    def load_or_default(cls, name: str | None = None) -> "MlflowTarget":
        return load_or_default(cls, name)

    def resolved_uri(self) -> str:
        return self.tracking_uri or default_tracking_uri()

    def resolved_experiment(self) -> str:
        """The experiment runs go to: the one named, else ``gpuflows`` (a flow fills in its system's first)."""
        return self.experiment or DEFAULT_EXPERIMENT
