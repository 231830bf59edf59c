"""The torch work that stands in for a Table A.1 workload on one Salus device, and what it measures (thesis §2.5.1).

A trace job of ``flows.gpu_sharing`` is named after a Table A.1 workload (a trainer, ``resnet50_50``) or an S5 model
(an inference loop, ``vgg19``), but runs an MLP on scikit-learn's digits (``tasks.digits``). The stand-in is sized
so that its *memory* is the workload's at ``MEMORY_SCALE`` (kilobytes where Table A.1 has megabytes), because
memory is what Salus admits by (Algorithm 2.1, Eq. 2.1): on the flow's simulated device of 16 GB x ``MEMORY_SCALE``
its lanes bind as the thesis's 16 GB P100's did, so PACK must queue and choose lanes, FIFO admits one job, SRTF and
FAIR fit what one lane holds.

* Persistent memory (Observation 2: model and optimizer state) sets the hidden width. A trainer holds 4 fp32 copies
  of its weights between iterations (the weights, their gradients, Adam's two moments); an inference loop 1.
* Ephemeral memory (what one iteration allocates and frees) sets the batch. A training step peaks with three
  ``batch x hidden`` fp32 tensors alive (pre-activation, activation, its gradient), a forward pass with two.

One Salus iteration is one optimizer step (a trainer) or one batch of requests (an inference loop), so, as for the
thesis's models, a larger batch makes both the ephemeral memory and the iteration longer. Nothing here is declared
to Salus as such: ``measure`` runs the stand-in and measures it (``tasks.salus.profiling``'s probes: the allocator's
statistics on CUDA, the tensors held and ``torch.profiler``'s allocations on the CPU), and the flow's jobs declare
what was measured. The sizing above is the only formula, and the measurement, not the formula, is what Salus sees.
"""

from __future__ import annotations

import inspect
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tasks.digits import digits_tensors, mlp
from tasks.runtime.slices import work_clock
from tasks.salus.profiling import MIB, CpuProbe, CudaProbe

MEMORY_SCALE = 1 / 1024
"""Stand-in bytes per Table A.1 byte: a resnet152_75 trainer (822 MB persistent, 13.0 GB ephemeral in Table A.1)
holds about 0.8 MB and allocates about 12.7 MB per step; the flow's simulated device is 16 MiB."""
WEIGHT_BYTES = 4  # fp32
TRAIN_COPIES = 4  # weights, gradients and Adam's two moments
PEAK_TENSORS = {"train": 3, "infer": 2}  # batch x hidden fp32 tensors alive at an iteration's peak
PROFILED_ITERATIONS = 2  # as ``tasks.salus.executor.PROFILE_ITERATIONS``: P at the last boundary, E = peak - P
TIMED_ITERATIONS = 5  # then timed without the profiler (the first iterations build lazy state: Adam's moments)


@dataclass(frozen=True)
class StandIn:
    """The stand-in's shape: ``kind`` (train/infer), the MLP's ``hidden`` width and the ``batch`` per iteration."""

    kind: str
    hidden: int
    batch: int


def stand_in(kind: str, persistent_mb: float, ephemeral_mb: float) -> StandIn:
    """The stand-in whose memory is a workload's ``persistent_mb`` and ``ephemeral_mb`` (Table A.1 MB) at
    ``MEMORY_SCALE`` (module docstring)."""
    weights = persistent_mb * MIB * MEMORY_SCALE / (TRAIN_COPIES if kind == "train" else 1) / WEIGHT_BYTES
    hidden = max(1, round((weights - 10) / 75))  # 64 -> hidden -> 10: 75 x hidden + 10 parameters
    batch = max(1, round(ephemeral_mb * MIB * MEMORY_SCALE / (PEAK_TENSORS[kind] * WEIGHT_BYTES * hidden)))
    return StandIn(kind, hidden, batch)


def train_step(model: Any, opt: Any, xs: Any, ys: Any, batch: int, gen: Any) -> None:
    """One Adam step on ``batch`` digits drawn with ``gen``."""
    import torch

    idx = torch.randint(0, len(xs), (batch,), generator=gen).to(xs.device)
    loss = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()


def answer(model: Any, xs: Any, batch: int, gen: Any) -> int:
    """Classify ``batch`` requests (digits drawn with ``gen``), forward only; how many were answered."""
    import torch

    with torch.no_grad():
        return len(model(xs[torch.randint(0, len(xs), (batch,), generator=gen).to(xs.device)]).argmax(1))


@dataclass(frozen=True)
class Measured:
    """What a stand-in measured alone: persistent and ephemeral MB (as Algorithm 2.1 takes them) and the median
    seconds of an iteration once its lazy state is built."""

    persistent_mb: float
    ephemeral_mb: float
    iteration_s: float


@lru_cache(maxsize=256)
def measure(shape: StandIn, device: str = "cpu") -> Measured:
    """Run the stand-in alone on ``device``: its memory over ``PROFILED_ITERATIONS`` iterations (the executor's
    profiling probes), then its time over ``TIMED_ITERATIONS`` more. Cached per shape and device for the process:
    a trace's jobs of one workload share it."""
    import torch

    torch.set_num_threads(1)  # as the jobs run (``tasks.salus.trace``)
    dev = torch.device(device)
    cuda = (torch.cuda, dev) if dev.type == "cuda" else None
    probe = CudaProbe(*cuda) if cuda else CpuProbe()
    clock = work_clock(cuda is not None)  # as the jobs' iterations are measured (``salus_iterations``)
    frame = inspect.currentframe()
    xs, ys = digits_tensors(dev)
    model = mlp(shape.hidden, 0, dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2) if shape.kind == "train" else None
    if opt is None:
        model.eval()
    gen = torch.Generator().manual_seed(0)
    times = []
    for i in range(PROFILED_ITERATIONS + TIMED_ITERATIONS):
        profiled = i < PROFILED_ITERATIONS
        if profiled:
            probe.start(frame)
        start = clock()
        train_step(model, opt, xs, ys, shape.batch, gen) if opt is not None else answer(model, xs, shape.batch, gen)
        if cuda:
            torch.cuda.synchronize(dev)
        if profiled:
            probe.stop(frame)
        else:
            times.append(clock() - start)
    persistent_mb, ephemeral_mb = probe.profile.sizes_mb()
    return Measured(persistent_mb, ephemeral_mb, statistics.median(times))
