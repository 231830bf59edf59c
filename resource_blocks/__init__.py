"""Prefect Blocks for gpuflows: the GPU pool, the MLflow target and scheduler-policy settings.

``prefect block register -m resource_blocks`` registers them. Every block works unsaved with
safe defaults (a simulated 2 x 16 GiB pool when no GPU is found, MLflow on SQLite in the
project's state folder), so flows run with no set-up; saving a block changes the defaults.
"""

from resource_blocks.gpu_pool import GpuPool
from resource_blocks.mlflow_target import MlflowTarget
from resource_blocks.scheduler_policy import SchedulerPolicy

__all__ = ["GpuPool", "MlflowTarget", "SchedulerPolicy"]
