"""Measure a Salus job's persistent and ephemeral memory over its first iterations (thesis Observation 2,
§2.3: persistent = model and optimizer state, resident between iterations; ephemeral = what one iteration
allocates on top and frees by its end).

Algorithm 2.1 needs ``P`` and ``E``. A job that declares none is profiled: its first iterations run while it
holds the whole device (``tasks.salus.executor``), each iteration is measured here, and the job is re-admitted
with what was measured. Per iteration ``i`` a probe records the level at its start ``s_i`` and its peak
``m_i``; when profiling ends ``P`` = the level at the last boundary, ``E = max_i m_i - P`` (so state an
iteration creates for good — Adam's moments on the first step — counts as persistent, not ephemeral).

* On CUDA (``CudaProbe``): level = ``torch.cuda.memory_allocated()`` after a synchronise; peak =
  ``max_memory_allocated()`` since ``reset_peak_memory_stats()`` at the iteration's start. Per process, so
  exactly this job's (one job per worker process).
* Without CUDA (``CpuProbe``): level = bytes of the distinct tensor storages the job's own frame holds
  between iterations (tensors, modules' parameters and buffers, optimizers' state, in locals or in lists,
  tuples and dicts of them); peak = level + the highest running sum of the CPU allocations and frees that
  ``torch.profiler`` (``profile_memory=True``) records on the job's thread during the iteration. Both are
  what the job really allocates; the CPU allocator has no ``memory_allocated`` of its own.
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass, field
from typing import Any

MIB = 2 ** 20
_MIN_MB = 1.0 / 1024  # a job that measured (almost) nothing is still charged a KiB: Alg. 2.1 needs sizes > 0
_PROFILER = threading.Lock()


@dataclass
class MemoryProfile:
    """Levels measured so far: ``(start, peak)`` bytes per profiled iteration and the latest boundary level."""

    iterations: list[tuple[int, int]] = field(default_factory=list)
    boundary: int = 0

    def sizes_mb(self) -> tuple[float, float]:
        """``(P, E)`` in MB, as Algorithm 2.1 takes them (each at least a KiB)."""
        peak = max((m for _, m in self.iterations), default=self.boundary)
        return max(self.boundary / MIB, _MIN_MB), max((peak - self.boundary) / MIB, _MIN_MB)


class CudaProbe:
    """One CUDA device's allocator statistics around each iteration (this process only)."""

    def __init__(self, cuda: Any, device: Any):
        self.cuda, self.device = cuda, device
        self.profile = MemoryProfile()

    def start(self, frame: types.FrameType | None) -> None:
        self.cuda.synchronize(self.device)
        self.cuda.reset_peak_memory_stats(self.device)
        self._start = self.cuda.memory_allocated(self.device)

    def close(self) -> None:
        """Nothing to stop: the allocator keeps its statistics anyway."""

    def stop(self, frame: types.FrameType | None) -> None:
        self.cuda.synchronize(self.device)
        self.profile.iterations.append((self._start, self.cuda.max_memory_allocated(self.device)))
        self.profile.boundary = self.cuda.memory_allocated(self.device)


class CpuProbe:
    """The job's held tensors between iterations and ``torch.profiler``'s allocation record during one."""

    def __init__(self) -> None:
        self.profile = MemoryProfile()
        self._profiler: Any = None

    def start(self, frame: types.FrameType | None) -> None:
        from torch.profiler import ProfilerActivity, profile, record_function

        self._start = held_bytes(frame)
        _PROFILER.acquire()  # one torch profiler per process: jobs in threads on two devices take turns
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profiler.__enter__()
        self._marker = record_function("salus-profile")
        self._marker.__enter__()

    def close(self) -> None:
        """Stop profiling (the job ended mid-iteration, or the iteration is over)."""
        if self._profiler is not None:
            self._marker.__exit__(None, None, None)
            self._profiler.__exit__(None, None, None)
            self._profiler = None
            _PROFILER.release()

    def stop(self, frame: types.FrameType | None) -> None:
        profiler = self._profiler
        self.close()
        events = profiler.profiler.kineto_results.events()
        thread = next(e.start_thread_id() for e in events if e.name() == "salus-profile")
        level = peak = 0
        for e in sorted((e for e in events if e.name() == "[memory]" and e.start_thread_id() == thread),
                        key=lambda e: e.start_ns()):
            level += e.nbytes()
            peak = max(peak, level)
        self.profile.iterations.append((self._start, self._start + peak))
        self.profile.boundary = held_bytes(frame)


def held_bytes(frame: types.FrameType | None) -> int:
    """Bytes of the distinct tensor storages reachable from ``frame``'s locals (see the module docstring)."""
    import torch

    seen: set[int] = set()
    storages: dict[int, int] = {}

    def visit(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > 4:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            if obj.is_leaf and obj.grad is not None:
                visit(obj.grad, depth + 1)
        elif isinstance(obj, torch.nn.Module):
            for t in [*obj.parameters(), *obj.buffers()]:
                visit(t, depth + 1)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                visit(state, depth + 1)
        elif isinstance(obj, dict):
            for value in obj.values():
                visit(value, depth + 1)
        elif isinstance(obj, (list, tuple, set)):
            for value in obj:
                visit(value, depth + 1)

    for value in (frame.f_locals.values() if frame is not None else ()):
        visit(value, 0)
    return sum(storages.values())
