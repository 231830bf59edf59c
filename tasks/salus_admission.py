"""Salus admission: how ``GpuTaskRunner(mode="salus")`` places a task — into a memory lane of a device that
one Salus executor leases whole, instead of a ledger lease of its own (thesis Ch. 2, Fig. 2.3).

A plain placement charges every task its own slice, so co-located torch jobs would each pay ``P + E`` and
nothing would decide which of them runs when. Under Salus the device is charged once (``ΣP + Σ_lanes max E``,
Eq. 2.1) by its ``tasks.salus_executor.SalusExecutor``, which admits each job into a lane (Algorithm 2.1) and
hands out iteration tokens under the chosen policy. ``SalusAdmission`` is the strategy the runner's
``_acquire``/``_release``/``_task_placement`` seam delegates to; it owns one executor per device of
``devices`` (opened on first use, closed with the runner).

    @salus_job(persistent="300MiB", ephemeral="2GiB", expected_s=60)
    @task
    def train(...):
        for step in salus_iterations(200):
            ...

    @flow(task_runner=GpuTaskRunner(mode="salus", salus_policy="fair"))
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable

from gpu.errors import ConfigError
from gpu.ledger import LedgerClient, Lease
from gpu.placement import ResourceRequest
from gpu.schedulers.salus.controller import SalusJob
from gpu.schedulers.salus.policies import ADMISSIONS, POLICIES
from tasks.requests import Lane
from tasks.salus_executor import SalusExecutor, declared_job, new_job_id

WORKERS = ("process", "thread")


@dataclass(frozen=True)
class SalusSettings:
    """The runner's Salus settings, checked (ConfigError naming the field).

    ``policy``: the devices' iteration scheduler (``fifo``/``pack``/``srtf``/``fair``/``weighted_fair``);
    ``devices``: pool device indices with an executor; ``admission``: override the policy's admission
    (``exclusive``/``one_lane``/``lanes``); ``max_jobs_per_device``: jobs admitted at once per device (in
    process workers: the worker processes per device); ``workers``: ``process`` (one worker process per
    admitted job, each capped at its lane budget) or ``thread`` (CPU-only work and tests: no memory cap).
    """

    policy: str = "pack"
    devices: tuple[int, ...] = (0,)
    admission: str | None = None
    max_jobs_per_device: int = 8
    workers: str = "process"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError("salus_policy", self.policy, f"unknown; choose one of {sorted(POLICIES)}")
        if self.admission is not None and self.admission not in ADMISSIONS:
            raise ConfigError("salus_admission", self.admission, f"unknown; choose one of {list(ADMISSIONS)}")
        devices = self.devices
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__") or not tuple(devices) \
                or len(set(devices)) != len(tuple(devices)) \
                or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
            raise ConfigError("salus_devices", devices, "must be distinct device indices >= 0")
        object.__setattr__(self, "devices", tuple(devices))
        n = self.max_jobs_per_device
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("max_jobs_per_device", n, "must be a whole number >= 1")
        if self.workers not in WORKERS:
            raise ConfigError("salus_workers", self.workers, f"choose one of {WORKERS}")


class SalusAdmission:
    """Places a runner's tasks into Salus lanes: one executor per device, admission instead of a lease.

    Args:
        settings: the runner's checked Salus settings.
        ledger: opens the pool's ledger (the runner's, on first use); each executor leases its device on it.
        allocation_timeout: how long an executor waits for its device, and a job for a lane.
        on_lost: called with each admitted job's placement id when its executor's device lease is lost (the
            runner fails the task holding it and stops it).
    """

    def __init__(self, settings: SalusSettings, ledger: Callable[[], LedgerClient],
                 allocation_timeout: float | None, on_lost: Callable[[str, str], Any]):
        self.settings = settings
        self._ledger = ledger
        self._timeout = allocation_timeout
        self._on_lost = on_lost
        self._executors: dict[int, SalusExecutor] = {}
        self._lanes: dict[str, tuple[SalusExecutor, Lane]] = {}  # placement id -> its executor and lane
        self._lock = threading.Lock()

    def executor(self, device: int) -> SalusExecutor:
        """The device's executor, leasing the device on first use."""
        if device not in self.settings.devices:
            raise ConfigError("devices", device, f"no Salus executor here; salus_devices={self.settings.devices}")
        with self._lock:
            if device not in self._executors:
                self._executors[device] = SalusExecutor(
                    self._ledger(), device, policy=self.settings.policy, admission=self.settings.admission,
                    max_jobs=self.settings.max_jobs_per_device, allocation_timeout=self._timeout,
                    on_lost=self._executor_lost)
            return self._executors[device]

    def check(self, task: Any, request: ResourceRequest) -> None:
        """A task's Salus declaration against its device, at submission (no declaration, bad sizes, a job that
        never fits the device, SRTF without ``expected_s``: one error in the flow, before any work). A job to be
        profiled is checked against the device once measured (``SalusExecutor.profiled``)."""
        job = declared_job(task, task.name)
        controller = self.executor(self.pick_device(request)).controller
        if isinstance(job, SalusJob):
            controller.lanes.charge(job.job_id, job.persistent_mb, job.ephemeral_mb)
        if controller.rule.needs_expected_time and job.expected_s is None:
            raise ConfigError(f"jobs[{task.name}].expected_s", None, f"{self.settings.policy} needs it")

    def pick_device(self, request: ResourceRequest) -> int:
        """The task's pinned device (``gpu_request(devices=...)``), else the executor with the fewest jobs."""
        if request.devices:
            return request.devices[0]
        with self._lock:
            load = {d: len(e.controller.lanes.persistent) + len(e.controller.queue)
                    for d, e in self._executors.items()}
        return min(self.settings.devices, key=lambda d: (load.get(d, 0), d))

    def acquire(self, task: Any, request: ResourceRequest, cancel_event: threading.Event) -> Lease:
        """Wait until the device's executor admits the task into a lane; the placement is the device's lease
        under the job's own id, with the lane budget ``P + L_lane`` as its memory."""
        job = declared_job(task, new_job_id(task.name))
        executor = self.executor(self.pick_device(request))
        lane = executor.admit(job, cancel_event, self._timeout)
        device = executor.placement or Lease("", "", (executor.device,), 1.0, 0)
        placement = dataclasses.replace(device, lease_id=f"{device.lease_id}#{job.job_id}", label=task.name,
                                        memory=lane.memory_cap)
        with self._lock:
            self._lanes[placement.lease_id] = (executor, lane)
        return placement

    def lane(self, placement: Lease | None) -> Lane | None:
        with self._lock:
            held = self._lanes.get(placement.lease_id) if placement is not None else None
        return held[1] if held else None

    def release(self, placement: Lease) -> str | None:
        """The job left its lane (finished, failed, cancelled or crashed): its executor frees it. Returns why the
        task must not be trusted if the executor lost its device lease meanwhile."""
        with self._lock:
            executor, lane = self._lanes.pop(placement.lease_id)
        executor.leave(lane.job_id)
        if executor.lost is None:
            return None
        return f"the Salus executor of gpu{executor.device} lost its device lease while the job ran: {executor.lost}"

    def _executor_lost(self, executor: SalusExecutor, reason: str) -> None:
        """The device's lease is gone: every job admitted there is told (the runner stops it)."""
        with self._lock:
            held = [pid for pid, (e, _) in self._lanes.items() if e is executor]
        for placement_id in held:
            self._on_lost(placement_id, reason)

    def close(self) -> None:
        with self._lock:
            executors, self._executors = list(self._executors.values()), {}
        for executor in executors:
            executor.close()
