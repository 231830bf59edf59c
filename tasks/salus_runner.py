"""``SalusTaskRunner``: Prefect tasks co-located on pool devices by Salus executors (thesis Ch. 2).

A plain ``GpuTaskRunner`` takes one ledger lease per task, so co-located torch jobs would each be charged
``P + E`` and nothing would decide which runs when. Here each device of ``salus_devices`` gets one
``tasks.salus_executor.SalusExecutor`` (opened on first use, closed with the runner) that leases the whole
device for its life; a task declares its memory with ``@salus_job(...)`` and is *admitted* into a lane by
its device's executor instead of leasing a slice (``_acquire``/``_release`` are the runner's seam). The
task then marks its iterations with ``for step in salus_iterations(n):``. Jobs stay Prefect tasks: states,
retries and the MLflow record per task are the plain runner's.

Process mode keeps one worker process per admitted job (``max_jobs_per_device`` workers per device, and the
executor admits no more), so an admitted job never waits for a process while holding its lane.

    @salus_job(persistent="300MiB", ephemeral="2GiB", expected_s=60)
    @task
    def train(...):
        for step in salus_iterations(200):
            ...

    @flow(task_runner=SalusTaskRunner(salus_policy="fair"))
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from typing import Any

from gpu.errors import ConfigError
from gpu.ledger import Lease
from gpu.placement import ResourceRequest
from gpu.schedulers.salus.policies import ADMISSIONS, POLICIES
from tasks.requests import Lane, TaskPlacement, resolve_request
from tasks.runners import GpuTaskRunner
from tasks.salus_executor import SalusExecutor, declared_job, new_job_id


class SalusTaskRunner(GpuTaskRunner):
    """A ``GpuTaskRunner`` whose tasks share devices through Salus lanes.

    Args:
        salus_policy: ``fifo``/``pack``/``srtf``/``fair``/``weighted_fair`` (per-device iteration scheduler).
        salus_devices: pool device indices with an executor; a task pinned with ``gpu_request(devices=...)``
            goes to that device's executor, others to the executor with the fewest jobs.
        salus_admission: override the policy's admission (``exclusive``/``one_lane``/``lanes``).
        max_jobs_per_device: jobs admitted at once per device (= worker processes per device).
        Other arguments: as ``GpuTaskRunner`` (``workers_per_device_set`` is ``max_jobs_per_device``).
    """

    def __init__(self, pool=None, mode: str = "process", salus_policy: str = "pack",
                 salus_devices: tuple[int, ...] = (0,), salus_admission: str | None = None,
                 max_jobs_per_device: int = 8, **kwargs):
        kwargs.pop("workers_per_device_set", None)
        if salus_policy not in POLICIES:
            raise ConfigError("salus_policy", salus_policy, f"unknown; choose one of {sorted(POLICIES)}")
        if salus_admission is not None and salus_admission not in ADMISSIONS:
            raise ConfigError("salus_admission", salus_admission, f"unknown; choose one of {list(ADMISSIONS)}")
        devices = tuple(salus_devices)
        if not devices or len(set(devices)) != len(devices) or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
            raise ConfigError("salus_devices", salus_devices, "must be distinct device indices >= 0")
        if isinstance(max_jobs_per_device, bool) or not isinstance(max_jobs_per_device, int) or max_jobs_per_device < 1:
            raise ConfigError("max_jobs_per_device", max_jobs_per_device, "must be a whole number >= 1")
        super().__init__(pool, mode=mode, workers_per_device_set=max_jobs_per_device, **kwargs)
        self.salus_policy, self.salus_devices = salus_policy, devices
        self.salus_admission, self.max_jobs_per_device = salus_admission, max_jobs_per_device
        self._executors: dict[int, SalusExecutor] = {}
        self._lanes: dict[str, tuple[SalusExecutor, Lane]] = {}  # task lease id -> its executor and lane
        self._executors_lock = threading.Lock()

    def _config(self) -> dict[str, Any]:
        config = {**super()._config(), "salus_policy": self.salus_policy, "salus_devices": self.salus_devices,
                  "salus_admission": self.salus_admission, "max_jobs_per_device": self.max_jobs_per_device}
        config.pop("workers_per_device_set")
        return config

    def submit(self, task, parameters: dict[str, Any], wait_for=None, dependencies=None):
        """Check the task's Salus declaration against its device first (no declaration, bad sizes, a job that
        can never fit the device, SRTF without ``expected_s``: one error in the flow, before any work)."""
        if self._started:
            job = declared_job(task, task.name)
            controller = self.executor(self._pick_device(resolve_request(task, self.default_request))).controller
            controller.lanes.charge(job.job_id, job.persistent_mb, job.ephemeral_mb)
            if controller.rule.needs_expected_time and job.expected_s is None:
                raise ConfigError(f"jobs[{task.name}].expected_s", None, f"{self.salus_policy} needs it")
        return super().submit(task, parameters, wait_for, dependencies)

    # --- the seam: admission by the device's executor instead of a lease per task ---------------------------
    def executor(self, device: int) -> SalusExecutor:
        """The device's executor, leasing the device on first use."""
        if device not in self.salus_devices:
            raise ConfigError("devices", device, f"no Salus executor here; salus_devices={self.salus_devices}")
        with self._executors_lock:
            if device not in self._executors:
                ledger = self._ensure_ledger()
                self._executors[device] = SalusExecutor(
                    ledger, device, policy=self.salus_policy, admission=self.salus_admission,
                    max_jobs=self.max_jobs_per_device, allocation_timeout=self.allocation_timeout)
            return self._executors[device]

    def _pick_device(self, request: ResourceRequest) -> int:
        if request.devices:
            return request.devices[0]
        with self._executors_lock:
            load = {d: len(self._executors[d].controller.lanes.persistent) + len(self._executors[d].controller.queue)
                    if d in self._executors else 0 for d in self.salus_devices}
        return min(self.salus_devices, key=lambda d: (load[d], d))

    def _acquire(self, task, task_run_id: uuid.UUID, request: ResourceRequest, cancel_event: threading.Event) -> Lease:
        job = declared_job(task, new_job_id(task.name))
        executor = self.executor(self._pick_device(request))
        lane = executor.admit(job, cancel_event, self.allocation_timeout)
        device = executor.placement or Lease("", "", (executor.device,), 1.0, 0)
        placement = dataclasses.replace(device, lease_id=f"{device.lease_id}#{job.job_id}", label=task.name,
                                        memory=lane.memory_cap)
        with self._leases_lock:
            self._held[placement.lease_id] = task_run_id
        self._lanes[placement.lease_id] = (executor, lane)
        return placement

    def _release(self, placement: Lease, task_name: str) -> str | None:
        """The job left its lane (finished, failed, cancelled or crashed): the executor frees it."""
        executor, lane = self._lanes.pop(placement.lease_id)
        executor.leave(lane.job_id)
        with self._leases_lock:
            self._held.pop(placement.lease_id, None)
            lost = self._lost.pop(placement.lease_id, None)
        lost = lost or executor.lost
        if lost is None:
            return None
        return (f"the Salus executor of gpu{executor.device} lost its device lease while task {task_name!r} "
                f"ran: {lost}")

    def _task_placement(self, placement: Lease | None) -> TaskPlacement:
        tp = super()._task_placement(placement)
        held = self._lanes.get(placement.lease_id) if placement is not None else None
        return dataclasses.replace(tp, lane=held[1]) if held else tp

    def _shutdown_backend(self) -> None:
        super()._shutdown_backend()
        with self._executors_lock:
            executors, self._executors = list(self._executors.values()), {}
        for executor in executors:
            executor.close()
