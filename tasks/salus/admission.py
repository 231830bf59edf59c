"""Salus admission: how ``GpuTaskRunner(admission=SalusColocation(...))`` places a task — into a memory lane of a
device that one Salus executor leases whole, instead of a ledger lease of its own (thesis Ch. 2, Fig. 2.3).

A plain placement charges every task its own slice, so co-located torch jobs would each pay ``P + E`` and
nothing would decide which of them runs when. Under Salus the device is charged once (``ΣP + Σ_lanes max E``,
Eq. 2.1) by its ``tasks.salus.executor.SalusExecutor``, which admits each job into a lane (Algorithm 2.1) and
hands out iteration tokens under the chosen policy. ``SalusColocation`` is the runner setting (an
``Admission`` of ``tasks.runtime.admission``: frozen, picklable, checked when made); ``SalusAdmission`` is the
live state the runner's acquire/release seam asks (an ``Admitter``): it owns one executor per device of
``devices`` (opened on first use, closed with the runner). The job's lane reaches its task as the placement's
admission payload (``tasks.salus.placement.current_lane``).

    @salus_job(persistent="300MiB", ephemeral="2GiB", expected_s=60)
    @task
    def train(...):
        for step in salus_iterations(200):
            ...

    @flow(task_runner=GpuTaskRunner(admission=SalusColocation(policy="fair")))

A flow that takes its runner from its parameters (a deployment) selects it with ``mode="salus"`` and the
``salus_*`` parameters (``salus_settings``). Jobs run in worker processes (the runner's ``mode="process"``),
one per admitted job: ``max_jobs_per_device`` per device, and the executor admits no more, so an admitted job
never waits for a process while holding its lane. Only a process can be capped at its lane budget ``P + L_lane``
(``torch.cuda.set_per_process_memory_fraction`` is per process), and a job that crashes takes neither the
executor nor the other jobs with it. Threads on per-lane CUDA streams would hand off faster but share one
allocator and one fate; the runner's ``mode="thread"`` runs jobs in threads for CPU-only work and tests.

A task that is no Salus job (a data loader, an evaluation: no ``@salus_job``) takes a plain slice with its usual
``gpu_options`` request, side by side with the Salus jobs (``SalusAdmission.ledger_request``). One that needs no
GPU, or fits a device no executor holds, leases it from the pool ledger, kept off the Salus devices; one that only
a Salus device can hold (a single-GPU pool, or pinned there) is hosted by that device's executor as a *tenant*:
its memory (``memory=``, else ``gpus`` x the device's memory) is charged as persistent memory in the executor's
Eq. 2.1 account, so lanes are admitted around it and it waits for room as a job does (under FIFO's exclusive
admission, for the device to empty). It takes no iteration tokens: like jobs in different lanes (§5.1), its
compute is not ordered by the policy. Either way one account holds each byte: the ledger's, or the executor's
inside its device lease.

Why not fold this into ``tasks.salus.lanes.submit_in_lane``: there the flow admits a job into a lease-less
executor and the job keeps a ledger lease of its own (Ekya's decided fraction, pinned where Ekya placed it), so
the ledger charges each job ``P + E`` and Salus only orders iterations. Here the executor is the one holder of the
device and charges ``ΣP + Σ_lanes max E``. One path cannot do both without one of them changing what it charges.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

from gpu.errors import ConfigError, NeverFitsError
from gpu.ledger import LedgerClient, Lease
from gpu.placement import ResourceRequest, check_ever_fits
from gpu.schedulers.salus.controller import SalusJob
from gpu.schedulers.salus.lanes import Margins
from gpu.schedulers.salus.policies import ADMISSIONS, POLICIES
from tasks.runtime.admission import AdmissionHost
from tasks.runtime.runners import MODES, GpuTaskRunner
from tasks.salus.executor import MIB, SalusExecutor, Undeclared, declared_job, is_salus_job, new_job_id
from tasks.salus.placement import Lane

TENANT_EPHEMERAL_MB = 1.0
"""A tenant's ephemeral size: it takes no tokens, so its memory is all persistent; Algorithm 2.1 needs an ``E`` > 0,
and a lane of 1 MB that a Salus job may grow and join (it runs there alone: the tenant never asks for a token)."""
TENANT_EXPECTED_S = 1e-6
"""A tenant's declared GPU time under the policy (SRTF needs one per job): it runs no iterations there."""
PARAMETERS = {"salus_policy": "policy", "salus_devices": "devices", "salus_admission": "admission_rule",
              "max_jobs_per_device": "max_jobs_per_device"}
"""Flow parameters of a Salus runner (``salus_settings``) and the ``SalusColocation`` field each sets."""


@dataclass(frozen=True)
class SalusColocation:
    """The runner's Salus admission (``GpuTaskRunner(admission=SalusColocation(...))``), checked when made
    (ConfigError naming the flow parameter that sets the field, ``PARAMETERS``).

    ``policy``: the devices' iteration scheduler (``fifo``/``pack``/``srtf``/``fair``/``weighted_fair``);
    ``devices``: pool device indices with an executor; ``admission_rule``: override the policy's admission
    (``exclusive``/``one_lane``/``lanes``); ``max_jobs_per_device``: jobs admitted at once per device (in
    process mode: the worker processes per device); ``margins``: the executors' safety margins (default the
    authors': ``P`` x 1.1, ``P + E`` x 1.05, 300 MB kept in reserve).
    """

    policy: str = "pack"
    devices: tuple[int, ...] = (0,)
    admission_rule: str | None = None
    max_jobs_per_device: int = 8
    margins: Margins = Margins()
    name: ClassVar[str] = "salus"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError("salus_policy", self.policy, f"unknown; choose one of {sorted(POLICIES)}")
        if self.admission_rule is not None and self.admission_rule not in ADMISSIONS:
            raise ConfigError("salus_admission", self.admission_rule, f"unknown; choose one of {list(ADMISSIONS)}")
        devices = self.devices
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__") or not tuple(devices) \
                or len(set(devices)) != len(tuple(devices)) \
                or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
            raise ConfigError("salus_devices", devices, "must be distinct device indices >= 0")
        object.__setattr__(self, "devices", tuple(devices))
        n = self.max_jobs_per_device
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("max_jobs_per_device", n, "must be a whole number >= 1")
        if not isinstance(self.margins, Margins):
            raise ConfigError("margins", self.margins, "must be a gpu.schedulers.salus.lanes.Margins")

    def open(self, host: AdmissionHost) -> "SalusAdmission":
        return SalusAdmission(self, host.ledger, host.allocation_timeout, host.on_lost)

    def worker_processes(self, default: int) -> int:
        """One worker process per job a device admits at once: an admitted job never waits for a process."""
        return self.max_jobs_per_device


def salus_settings(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Runner settings for a flow run whose parameters select Salus (``mode="salus"``): its ``SalusColocation``
    from the ``salus_*`` parameters (``PARAMETERS``) and the runner's mode from ``salus_workers`` (``process``,
    the default, or ``thread``); nothing for any other mode. A flow's ``configure`` hook adds them to its
    settings (``settings(parameters, **salus_settings(parameters))``), so a deployment chooses Salus like any
    other parameter (a bad value: ConfigError naming the parameter)."""
    if parameters.get("mode") != "salus":
        return {}
    workers = parameters.get("salus_workers") or "process"
    if workers not in MODES:
        raise ConfigError("salus_workers", workers, f"choose one of {MODES}")
    chosen = {field: parameters[name] for name, field in PARAMETERS.items() if parameters.get(name) is not None}
    return {"mode": workers, "admission": SalusColocation(**chosen)}


def salus_executor(runner: GpuTaskRunner, device: int) -> SalusExecutor:
    """The executor of ``device`` under ``runner``'s Salus admission (leasing the device on first use), for a
    flow or test that reads its controller or token log. ConfigError when the runner admits no Salus jobs."""
    admitter = runner.admitter()
    if not isinstance(admitter, SalusAdmission):
        raise ConfigError("admission", runner.admission, "the runner has no Salus admission (SalusColocation)")
    return admitter.executor(device)


class SalusAdmission:
    """Places a runner's tasks under Salus: Salus jobs into lanes (one executor per device, admission instead of a
    lease); other tasks onto a plain slice (a ledger lease off the Salus devices, or a tenant of an executor).

    Args:
        settings: the runner's checked Salus admission.
        ledger: opens the pool's ledger (the runner's, on first use); each executor leases its device on it.
        allocation_timeout: how long an executor waits for its device, and a job for a lane.
        on_lost: called with each admitted job's placement id when its executor's device lease is lost (the
            runner fails the task holding it and stops it).
    """

    def __init__(self, settings: SalusColocation, ledger: Callable[[], LedgerClient],
                 allocation_timeout: float | None, on_lost: Callable[[str, str], Any]):
        self.settings = settings
        self._ledger = ledger
        self._timeout = allocation_timeout
        self._on_lost = on_lost
        self._executors: dict[int, SalusExecutor] = {}
        self._lanes: dict[str, tuple[SalusExecutor, Lane | None]] = {}  # placement id -> executor, lane (None: tenant)
        self._lock = threading.Lock()

    def executor(self, device: int) -> SalusExecutor:
        """The device's executor, leasing the device on first use."""
        if device not in self.settings.devices:
            raise ConfigError("devices", device, f"no Salus executor here; salus_devices={self.settings.devices}")
        with self._lock:
            if device not in self._executors:
                self._executors[device] = SalusExecutor(
                    self._ledger(), device, policy=self.settings.policy, margins=self.settings.margins,
                    admission=self.settings.admission_rule,
                    max_jobs=self.settings.max_jobs_per_device, allocation_timeout=self._timeout,
                    on_lost=self._executor_lost)
            return self._executors[device]

    def ledger_request(self, task: Any, request: ResourceRequest) -> ResourceRequest | None:
        """The plain ledger lease a task takes, or None when a Salus executor places it (a Salus job, or a tenant).

        A task that is no Salus job and needs no GPU leases ``request`` as it is; one that needs a GPU leases it on
        the devices no executor holds (those it pinned, else the pool's others) where it fits there, so it never
        waits for a device an executor keeps for the whole run. Raises ConfigError or NeverFitsError, naming the
        task, for a request no device can serve (whole Salus devices; pinned others too small)."""
        if is_salus_job(task):
            return None
        if not request.uses_gpu:
            return request
        salus = set(self.settings.devices)
        pinned = request.devices
        others = [d for d in pinned if d not in salus] if pinned else \
            [d.index for node in self._ledger().capacity for d in node.devices if d.index not in salus]
        if others:
            plain = dataclasses.replace(request, devices=tuple(others))
            try:
                check_ever_fits(plain, self._ledger().capacity)
                return plain
            except NeverFitsError:
                if pinned:
                    raise
        if request.gpus >= 1:
            raise ConfigError("gpus", request.gpus, f"task {task.name!r} asks for whole devices that only Salus "
                              f"executors hold (salus_devices={self.settings.devices}); ask for a fraction or "
                              f"memory to run beside the Salus jobs")
        return None

    def check(self, task: Any, request: ResourceRequest) -> None:
        """A task's placement at submission: where it will run, and its Salus declaration or tenant memory
        against its device (no declaration, bad sizes, a job that never fits the device, SRTF without
        ``expected_s``: one error in the flow, before any work). A job to be profiled is checked against the
        device once measured (``SalusExecutor.profiled``)."""
        if self.ledger_request(task, request) is not None:
            return
        job, executor = self._placed(task, request, task.name)
        controller = executor.controller
        if isinstance(job, SalusJob):
            controller.lanes.charge(job.job_id, job.persistent_mb, job.ephemeral_mb)
        if controller.rule.needs_expected_time and job.expected_s is None:
            raise ConfigError(f"jobs[{task.name}].expected_s", None, f"{self.settings.policy} needs it")

    def _placed(self, task: Any, request: ResourceRequest, job_id: str) -> tuple[SalusJob | Undeclared, SalusExecutor]:
        """The task's Salus job (its declaration, checked first; or for a tenant its slice's memory as persistent
        memory, sized on the device it goes to) and the executor of that device, picked once."""
        job = declared_job(task, job_id) if is_salus_job(task) else None
        executor = self.executor(self.pick_device(request))
        if job is None:
            capacity_mb = executor.controller.lanes.capacity_mb
            memory_mb = request.memory / MIB if request.memory else request.gpus * capacity_mb
            job = SalusJob(job_id, memory_mb, TENANT_EPHEMERAL_MB, TENANT_EXPECTED_S, on_demand=True)
        return job, executor

    def pick_device(self, request: ResourceRequest) -> int:
        """Of the task's pinned devices (``gpu_request(devices=...)``), else of the Salus devices, the one whose
        executor has the fewest jobs."""
        with self._lock:
            load = {d: len(e.controller.lanes.persistent) + len(e.controller.queue)
                    for d, e in self._executors.items()}
        return min(request.devices or self.settings.devices, key=lambda d: (load.get(d, 0), d))

    def acquire(self, task: Any, request: ResourceRequest, cancel_event: threading.Event) -> Lease:
        """Wait until the device's executor admits the task (a Salus job into a lane, a tenant beside them); the
        placement is the device's lease under the job's own id, with the job's budget as its memory: a lane's
        ``P + L_lane``, a tenant's own request."""
        job, executor = self._placed(task, request, new_job_id(task.name))
        lane = executor.admit(job, cancel_event, self._timeout)
        device = executor.placement or Lease("", "", (executor.device,), 1.0, 0)
        tenant = not is_salus_job(task)
        placement = dataclasses.replace(
            device, lease_id=f"{device.lease_id}#{job.job_id}", label=task.name,
            fraction=job.persistent_mb / executor.controller.lanes.capacity_mb if tenant else device.fraction,
            memory=int(job.persistent_mb * MIB) if tenant else lane.memory_cap)
        with self._lock:
            self._lanes[placement.lease_id] = (executor, None if tenant else lane)
        return placement

    def holds(self, placement: Lease) -> bool:
        """Whether an executor placed this (else it is a plain ledger lease)."""
        with self._lock:
            return placement.lease_id in self._lanes

    def payload(self, placement: Lease) -> dict[str, Any] | None:
        """The job's lane as its placement's admission payload (``tasks.salus.placement``); None for a tenant
        (its budget is its placement's memory) or a plain lease."""
        with self._lock:
            held = self._lanes.get(placement.lease_id)
        lane = held[1] if held else None
        return None if lane is None else lane.payload()

    def release(self, placement: Lease) -> str | None:
        """The job left the executor (finished, failed, cancelled or crashed): its memory is freed. Returns why the
        task must not be trusted if the executor lost its device lease meanwhile."""
        with self._lock:
            executor, _ = self._lanes.pop(placement.lease_id)
        executor.leave(placement.lease_id.rsplit("#", 1)[1])
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

