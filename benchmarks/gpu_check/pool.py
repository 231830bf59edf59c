"""Check 2: the pool on real devices under ``GpuTaskRunner`` in process mode.

One flow on a pool of this machine's NVML devices, in four phases of real torch tasks (``work.slice_task``):

A. four ``gpus=0.25`` tasks share one device: they meet at a ``Rendezvous`` (so all four held their slices at
   once), then each allocates 1 GiB and multiplies matrices; each sees only its device (one CUDA device, with the
   lease's NVML UUID);
B. a task declaring ``memory="2GiB"`` that allocates 4 GiB fails with torch's out-of-memory error naming its cap
   (``slices.enforce``), beside three ``gpus=0.25`` neighbours that met it first and finish;
C. two ``gpus=1`` tasks get distinct devices where there are several, and queue (one after the other) on one;
D. on a runner with one worker process, a task with no memory cap allocating 3 GiB after a capped task: a cap
   set with ``torch.cuda.set_per_process_memory_fraction`` lasts as long as the process, so it must not outlive
   the task that asked for it.

Where the runner should put A's and C's tasks is worked out first with the project's own ledger on a copy of the
machine's devices (``plan``: the placement arithmetic, no device needed), and the run is held to it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

from prefect import flow

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.report import Outcome, verdict
from benchmarks.gpu_check.work import slice_task
from gpu.devices import Device, Node, PoolSpec, nvml_devices
from gpu.placement import ResourceRequest
from gpu.units import parse_memory

QUARTERS = 4
CAP, OVER = "2GiB", 4.0  # the declared cap, and the GiB the capped task allocates
WHOLE = 2
POOL = "gpu-check"


@dataclass(frozen=True)
class Plan:
    """Where the project's ledger places the checks' requests on these devices: the device each of the four
    quarter slices lands on (they share one), and for two ``gpus=1`` requests either two devices or a queue."""

    quarter_devices: tuple[int, ...]
    whole_devices: tuple[int, ...]  # one entry when the second request must wait: it queues

    @property
    def whole_queue(self) -> bool:
        return len(self.whole_devices) < WHOLE


def plan(devices: Sequence[Device]) -> Plan:
    """The placement arithmetic: the project's ledger (``gpu.pool.PoolLedger``, in memory) on a copy of ``devices``."""
    from gpu.pool import PoolLedger

    spec = PoolSpec((Node("plan", tuple(dataclasses.replace(d, simulated=True) for d in devices), 1.0),))
    ledger = PoolLedger(spec, heartbeat=False)
    try:
        quarters = [ledger.submit_and_try(ResourceRequest(gpus=1 / QUARTERS))[1] for _ in range(QUARTERS)]
        for lease in quarters:
            ledger.release(lease.lease_id)
        whole = [ledger.submit_and_try(ResourceRequest(gpus=1))[1] for _ in range(WHOLE)]
        return Plan(tuple(lease.devices[0] for lease in quarters),
                    tuple(lease.devices[0] for lease in whole if lease is not None))
    finally:
        ledger.close()


def torch_size(nbytes: float) -> str:
    """``nbytes`` as torch's CUDA allocator writes sizes in its out-of-memory message (``format_size``)."""
    for limit, unit, scale in ((1024, "bytes", 1), (2**20, "KiB", 1024), (2**30, "MiB", 2**20)):
        if nbytes <= limit:
            return f"{int(nbytes)} bytes" if unit == "bytes" else f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes / 2**30:.2f} GiB"


def names_cap(message: str, cap: int) -> bool:
    """Whether an out-of-memory ``message`` names the cap: with a per-process fraction set (``slices.enforce`` sets
    ``cap / total``) torch writes ``"<fraction x total> allowed;"``, i.e. the cap."""
    return "out of memory" in message.lower() and f"{torch_size(cap)} allowed" in message


@flow(name="gpu-check-pool")
def pool_flow(workdir: str, quick: bool, pool: Any) -> dict[str, Any]:
    """Phases A-D (module docstring) on this flow's runner; D on a runner of its own on ``pool`` (the same
    ``GpuPool``) with one worker process."""
    from tasks.runtime.rendezvous import Rendezvous
    from tasks.runtime.requests import gpu_options
    from tasks.runtime.runners import GpuTaskRunner

    iterations = 10 if quick else 50
    patience = timedelta(seconds=20)
    meet = Rendezvous.create(workdir, "quarters-", QUARTERS, patience)
    with gpu_options(gpus=1 / QUARTERS):
        quarters = [slice_task.submit(1.0, iterations, meet, rank) for rank in range(QUARTERS)]
    shared = [f.result() for f in quarters]
    meet = Rendezvous.create(workdir, "capped-", QUARTERS, patience)
    with gpu_options(gpus=1 / QUARTERS):
        neighbours = [slice_task.submit(0.5, iterations, meet, rank) for rank in range(QUARTERS - 1)]
    with gpu_options(memory=CAP):
        capped = slice_task.submit(OVER, iterations, meet, QUARTERS - 1)
    capped.wait()
    with gpu_options(gpus=1):
        whole = [slice_task.submit(0.5, 4 * iterations) for _ in range(WHOLE)]
    out = {"shared": shared, "neighbours": [f.result() for f in neighbours],
           "capped_state": capped.state.type.value, "capped_message": capped.state.message or "",
           "whole": [f.result() for f in whole]}
    single = GpuTaskRunner(pool=pool, mode="process", workers_per_device_set=1, tracking=False)
    with single:  # both on device 0: one set of visible devices, so one worker process runs both
        with gpu_options(memory=CAP, devices=(0,)):
            first = single.submit(slice_task, {"alloc_gib": 1.0, "iterations": iterations})
            first.wait()
        with gpu_options(gpus=1 / QUARTERS, devices=(0,)):
            after = single.submit(slice_task, {"alloc_gib": OVER - 1, "iterations": iterations})
            after.wait()
    out["after_cap"] = {"first": first.state.type.value, "state": after.state.type.value,
                        "message": after.state.message or ""}
    return out


def check(settings: Settings) -> Outcome:
    from resource_blocks import GpuPool
    from tasks.runtime.runners import GpuTaskRunner

    devices = nvml_devices()
    expected = plan(devices)
    pool = GpuPool(name=POOL, device_backend="nvml")
    runner = GpuTaskRunner(pool=pool, mode="process", workers_per_device_set=QUARTERS, tracking=False)
    seen = pool_flow.with_options(task_runner=runner)(str(settings.workdir), settings.quick, pool)
    return judge(expected, seen, devices)


def judge(expected: Plan, seen: dict[str, Any], devices: Sequence[Device]) -> Outcome:
    """Hold the run (``pool_flow``'s result) to the plan and to what each phase must show."""
    uuid = {d.index: d.uuid.lower() for d in devices}
    failures: list[str] = []
    shared = seen["shared"]
    used = sorted({tuple(r["devices"]) for r in shared})
    if used != [(expected.quarter_devices[0],)] or len(set(expected.quarter_devices)) != 1:
        failures.append(f"quarter slices on {used}, the ledger's plan {sorted(set(expected.quarter_devices))}")
    for r in shared + seen["neighbours"] + seen["whole"]:
        shown = [u.lower() for u in r["uuids"]]
        if r["torch_devices"] != len(r["devices"]) or shown != [uuid[i] for i in r["devices"]]:
            failures.append(f"a task leased {r['devices']} but CUDA showed it {r['uuids']} "
                            f"(CUDA_VISIBLE_DEVICES={r['visible']})")
            break
    oom = seen["capped_state"] == "FAILED" and names_cap(seen["capped_message"], parse_memory(CAP, "memory"))
    if not oom:
        failures.append(f"the {CAP}-capped task allocating {OVER:g} GiB ended {seen['capped_state']}: "
                        f"{seen['capped_message'][:160]!r}")
    if len(seen["neighbours"]) != QUARTERS - 1:
        failures.append("its neighbours did not all finish")
    whole = seen["whole"]
    whole_devices = [r["devices"][0] for r in whole]
    first, second = sorted(whole, key=lambda r: r["start"])
    queued = second["start"] >= first["end"]
    if expected.whole_queue and not queued:
        failures.append(f"two gpus=1 tasks ran at once on {len(devices)} device(s)")
    if not expected.whole_queue and len(set(whole_devices)) != WHOLE:
        failures.append(f"two gpus=1 tasks shared device(s) {whole_devices}")
    after = seen["after_cap"]
    if after["first"] != "COMPLETED":
        failures.append(f"a {CAP}-capped task allocating 1 GiB ended {after['first']}")
    leaked = after["state"] != "COMPLETED"
    if leaked:
        failures.append(f"an uncapped task after a {CAP}-capped one in the same worker ended {after['state']}: "
                        f"{after['message'][:120]!r} (the cap outlived its task)")
    figure = (f"4x0.25 at once on gpu{used[0][0] if len(used) == 1 else used}, "
              f"{min(r['allocated'] for r in shared) / 2**30:.1f} GiB each; {CAP} cap: "
              f"{'OOM naming it' if oom else 'no OOM naming it'}; gpus=1: "
              f"{'queued' if queued and expected.whole_queue else 'gpus ' + str(whole_devices)}; "
              f"cap after its task: {'leaked' if leaked else 'gone'}")
    figures = {"quarter_devices": [r["devices"][0] for r in shared], "quarter_tflops": [r["tflops"] for r in shared],
               "oom_names_cap": oom, "whole_devices": whole_devices, "whole_queued": queued,
               "cap_outlived_task": leaked}
    return verdict("pool", failures, figure, figures)

