"""What a task's slice of a GPU means, in one place: enforced and measured on real GPUs, emulated on a
simulated pool.

Schedulers decide from *measured* work (Ekya's retraining durations and frame rates, Cilantro's
latencies, FLUID's iteration times). A task measures its work with ``on_slice`` and reports
``SliceTiming.slice_s``: how long that work takes on the slice it was given.

- **Real GPU** (``cuda:N``): the share is enforced — the memory cap through torch's per-process memory
  fraction, the compute share through CUDA MPS's active-thread percentage when an MPS control daemon
  serves the worker (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, read when CUDA starts, so the process
  runner starts each worker process with it and keeps workers of different shares apart; see
  ``mps_environment`` and ``tasks.runtime.workers``). The timing is the wall clock after a
  device synchronise: what the slice really delivered, contention included.
- **Simulated pool** (``cpu``): there is no device to share. The work runs on the CPU at full speed
  and we measure its CPU time on the calling thread (``time.thread_time``: immune to other tasks
  competing for the same cores, which a GPU slice would not suffer either; gpuflows tasks run torch
  with one intra-op thread, so the calling thread does all the work). The emulation then says a
  fraction ``f`` of a device delivers ``f`` of its throughput, so ``slice_s = work_s / f``. This is the
  only place in gpuflows where a model stands in for hardware, and it takes a measurement as input:
  make the work heavier and ``slice_s`` grows with it.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from tasks.runtime.requests import TaskPlacement, current_placement

MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
_DEFAULT_MPS_PIPE = "/tmp/nvidia-mps"


@dataclass(frozen=True)
class SliceTiming:
    """One measured piece of work: its own time and the time it takes on the task's slice."""

    work_s: float   # measured: thread CPU time (simulated pool) or synchronised wall time (GPU)
    slice_s: float  # work_s / share when emulated; work_s itself on a real GPU
    share: float    # the fraction of one device the task held (1.0 outside a runner)
    emulated: bool  # True when slice_s comes from the simulated-pool emulation


class SliceClock:
    """Filled in when the ``on_slice`` block ends; read ``.timing`` after it."""

    timing: SliceTiming | None = None

    def __init__(self) -> None:
        self.timing = None


def _share(placement: TaskPlacement | None) -> float:
    if placement is None or not placement.gpu_indices:
        return 1.0
    return max(1e-6, min(1.0, placement.fraction))


def _on_gpu(placement: TaskPlacement | None) -> bool:
    return placement is not None and placement.device.startswith("cuda")


def work_clock(on_gpu: bool) -> Callable[[], float]:
    """The clock a piece of torch work is measured on: the wall clock on a GPU (read after a synchronise), the
    calling thread's CPU time on the CPU (see module docstring: what other processes on the machine take from the
    thread is not the work's cost)."""
    return time.perf_counter if on_gpu else time.thread_time


@contextmanager
def on_slice(placement: TaskPlacement | None = None) -> Iterator[SliceClock]:
    """Measure the work inside the block as time on the task's slice (see module docstring)."""
    p = placement or current_placement()
    clock = SliceClock()
    gpu = _on_gpu(p)
    now = work_clock(gpu)
    if gpu:
        import torch

        torch.cuda.synchronize()
    start = now()
    yield clock
    if gpu:
        torch.cuda.synchronize()
    work = now() - start
    share = _share(p)
    clock.timing = SliceTiming(work, work, share, False) if gpu else SliceTiming(work, work / share, share, True)


def mps_available() -> bool:
    """True when a CUDA MPS control daemon is listening (its pipe directory has a control socket)."""
    pipe = Path(os.environ.get(MPS_PIPE_ENV, _DEFAULT_MPS_PIPE))
    return (pipe / "control").exists()


def mps_environment(fraction: float) -> dict[str, str]:
    """Environment a worker process needs so MPS caps its compute at ``fraction`` of the device.

    Empty when no MPS daemon runs (the share is then a scheduling promise, not a hardware cap) or the
    task holds whole devices.
    """
    if fraction >= 1.0 or not mps_available():
        return {}
    return {MPS_THREADS_ENV: str(max(1, round(100 * fraction)))}


def memory_fraction(placement: TaskPlacement | None, device_memory: int) -> float:
    """The share of a device's ``device_memory`` a task's process may allocate: its memory cap's share, else all
    of it (1.0). A worker process serves task after task, and a cap set for one would otherwise stay on it."""
    cap = placement.memory_cap if placement is not None else 0
    return min(1.0, cap / device_memory) if cap and device_memory > 0 else 1.0


def enforce(placement: TaskPlacement | None = None) -> None:
    """Apply the slice inside a running task: cap torch's CUDA allocator at the placement's memory, or lift the
    cap an earlier task of the same worker process left (``memory_fraction``: torch's fraction lasts as long as
    the process).

    A no-op on a simulated pool. Compute shares are applied before CUDA starts (``mps_environment``, through
    the runner's worker processes), not here.
    """
    p = placement or current_placement()
    if not _on_gpu(p):
        return
    import torch

    dev = torch.device(p.device)
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(memory_fraction(p, total), dev)
