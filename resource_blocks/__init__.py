"""Prefect Blocks for gpuflows: the GPU pool, the MLflow target and scheduler-policy settings.

``prefect block register -m resource_blocks`` registers them. Every block works unsaved with
safe defaults (a simulated 2 x 16 GiB pool when no GPU is found, MLflow on SQLite in the
project's state folder), so flows run with no set-up; saving a block changes the defaults.

Importing this package first points an unset ``PREFECT_HOME`` at the project's (``gpu.state.prefect_home``), so
blocks saved and runs started by a script land where ``make server`` shows them. When Prefect was loaded first
with a home of its own (``prefect block register -m resource_blocks`` outside the checkout, whose
``pyproject.toml`` names the project's home), one line on stderr says where this process's blocks and runs go.
"""

import sys

from gpu.state import default_prefect_home, prefect_home

_PROJECT_HOME = default_prefect_home()  # before the modules below import Prefect

from resource_blocks.gpu_pool import GpuPool  # noqa: E402
from resource_blocks.mlflow_target import MlflowTarget  # noqa: E402
from resource_blocks.scheduler_policy import SchedulerPolicy  # noqa: E402

__all__ = ["GpuPool", "MlflowTarget", "SchedulerPolicy"]


def _say_where_prefect_writes() -> None:
    from prefect.settings import get_current_settings

    home = get_current_settings().home.expanduser().resolve()
    if home != prefect_home().resolve():
        print(f"gpuflows: Prefect in this process uses PREFECT_HOME={home}, not the project's {prefect_home()} "
              f"that `make server` shows; export PREFECT_HOME={prefect_home()} (or run from the checkout)",
              file=sys.stderr)


if not _PROJECT_HOME:
    _say_where_prefect_writes()
