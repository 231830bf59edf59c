"""Check 7: NVML readings recorded per task in MLflow (``tasks.runtime.tracking``).

Two ``gpus=0.5`` tasks of real torch work under ``GpuTaskRunner`` (process mode) with MLflow tracking on a
SQLite store of the check's own: when each task ends the runner reads NVML's utilisation and memory in use on the
devices it held, and its nested MLflow run must carry them (``GPU_UTIL_METRIC``, ``GPU_MEMORY_METRIC``) with the
memory above zero (the task's worker still holds its CUDA context then). SKIPs where mlflow is not installed: it
does not fit beside torch in the GPU machine's transfer, and nothing else in the command imports it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from prefect import flow

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.report import Outcome, verdict
from benchmarks.gpu_check.work import slice_task

EXPERIMENT = "gpuflows-gpu-check"
TASKS = 2


@flow(name="gpu-check-tracking")
def tracking_flow() -> list[dict[str, Any]]:
    from tasks.runtime.requests import gpu_options

    with gpu_options(gpus=1 / TASKS):
        futures = [slice_task.submit(0.5, 40) for _ in range(TASKS)]
    return [f.result() for f in futures]


def check(settings: Settings) -> Outcome:
    if importlib.util.find_spec("mlflow") is None:
        return Outcome("tracking", "SKIP", detail="mlflow is not installed")
    from resource_blocks import GpuPool, MlflowTarget
    from tasks.runtime.runners import GpuTaskRunner
    from tasks.runtime.tracking import open_client

    uri = f"sqlite:///{settings.workdir / 'mlflow.db'}"
    runner = GpuTaskRunner(pool=GpuPool(name="gpu-check-tracking", device_backend="nvml"), mode="process",
                           tracking=MlflowTarget(tracking_uri=uri, experiment=EXPERIMENT))
    tracking_flow.with_options(task_runner=runner)()
    client = open_client(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return judge([run.data.metrics for run in runs if "mlflow.parentRunId" in run.data.tags])


def judge(metrics: list[dict[str, float]]) -> Outcome:
    """Each task's nested run has NVML's utilisation and a memory reading above zero."""
    from tasks.runtime.tracking import GPU_MEMORY_METRIC, GPU_UTIL_METRIC

    tasks = [m for m in metrics if "gpu_share" in m]
    failures = []
    if len(tasks) < TASKS:
        failures.append(f"{len(tasks)} task runs with a gpu_share in MLflow, {TASKS} expected")
    missing = [m for m in tasks if GPU_UTIL_METRIC not in m or not m.get(GPU_MEMORY_METRIC, 0) > 0]
    if missing:
        failures.append(f"{len(missing)} task run(s) without NVML utilisation and memory")
    util = [m.get(GPU_UTIL_METRIC) for m in tasks]
    memory = [m.get(GPU_MEMORY_METRIC) for m in tasks]
    figure = f"{len(tasks)} task runs: util {util} %, memory {[round(v or 0) for v in memory]} MiB"
    return verdict("tracking", failures, figure, {"utilization_pct": util, "memory_mb": memory})
