"""Flows that admit their own Salus jobs: a token-logging executor and "admit, then submit into the lane".

A flow whose jobs keep their own ledger leases (Ekya's windows, ``tasks.ekya.salus``: each job holds the GPU
fraction Ekya decided, pinned where Ekya's plan put it, and the flow's runner also serves tasks that are no
Salus jobs) drives a device's ``SalusExecutor`` directly instead of through the runner's Salus admission:
the flow admits the job (Algorithm 2.1 gives it a lane, thesis Ch. 2), submits its task with that lane, and
the job leaves the lane when the task ends, whatever way it ends. The executor holds no ledger lease
(``lease=False``), so the ledger stays the one account of the pool; it only orders iterations inside it.

This is the second of two admission paths, on purpose: the runner's (``tasks.salus.admission``, behind
``GpuTaskRunner(admission=SalusColocation(...))``) makes the executor the one holder of its device, charging
``ΣP + Σ_lanes max E`` (Eq. 2.1) instead of each job's lease. Serving Ekya through it would drop Ekya's decided
fractions from the ledger (and its pinned placement); serving the runner through this one would charge every job
``P + E`` again.
"""

from __future__ import annotations

import time
from typing import Any

from gpu.schedulers.salus.controller import SalusJob, SalusStep
from tasks.runtime.requests import gpu_options
from tasks.salus.executor import SalusExecutor
from tasks.salus.placement import Lane


class LoggedSalusExecutor(SalusExecutor):
    """A Salus executor that keeps its token log, every iteration's end ``(now, job_id, gpu_s)`` with the time the
    job measured and reported at hand-off, and the most lanes it had open at once."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.iterations: list[tuple[float, str, float]] = []
        self.peak_lanes = 0
        super().__init__(*args, **kwargs)

    def _apply(self, step: SalusStep) -> None:
        super()._apply(step)
        self.peak_lanes = max(self.peak_lanes, len(self.controller.lane_views()))

    def end(self, job_id: str, gpu_s: float, more: bool = False) -> int | None:
        if job_id in self._jobs:
            self.iterations.append((self.now(), job_id, gpu_s))
        return super().end(job_id, gpu_s, more)


def submit_in_lane(executor: SalusExecutor, job: SalusJob, task: Any, request: dict[str, Any], *args: Any,
                   **kwargs: Any) -> tuple[Any, Lane, float]:
    """Admit ``job`` (blocks until Algorithm 2.1 finds it a lane), then submit ``task(*args, lane=lane, **kwargs)``
    with the ledger request ``request`` (``gpu_options`` fields). Returns the future, the lane and the seconds
    the job waited for admission; the job leaves its lane when the task ends (completed, failed, cancelled or
    crashed) or if the submission itself fails."""
    start = time.monotonic()
    lane = executor.admit(job)
    waited = time.monotonic() - start
    try:
        with gpu_options(**request):
            future = task.submit(*args, lane=lane, **kwargs)
    except BaseException:
        executor.leave(job.job_id)
        raise
    future.add_done_callback(lambda _: executor.leave(job.job_id))
    return future, lane, waited
