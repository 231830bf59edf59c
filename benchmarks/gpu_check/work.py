"""The torch work the checks place with the project's runners: each task reports what it was given and saw.

Tasks live in this light module (torch is imported inside them) so the runner's worker processes unpickle them by
reference. A task applies its slice the way the project's own tasks do (``tasks.runtime.slices.enforce``, as
``flows.pool_demo`` and FLUID's profiler call it), allocates real tensors, does a bounded amount of real work and
returns what a check needs to judge the placement: the lease, what CUDA showed it, what it allocated, when it ran.
"""

from __future__ import annotations

import os
import time
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from benchmarks.gpu_check.kernels import matmul_rate
from tasks.runtime.rendezvous import Rendezvous
from tasks.runtime.requests import current_placement
from tasks.runtime.slices import MPS_THREADS_ENV, enforce
from tasks.salus.executor import salus_iterations, salus_job
from tasks.salus.placement import placement_lane

GIB = 2**30
LANE_PERSISTENT, LANE_EPHEMERAL = "512MiB", "2GiB"  # what each Salus lane job declares (it holds less: see lane_job)


def seen_devices() -> dict[str, Any]:
    """What CUDA shows this process: CUDA_VISIBLE_DEVICES, torch's device count and each device's UUID (NVML's form)."""
    import torch

    count = torch.cuda.device_count()
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "torch_devices": count,
            "uuids": [f"GPU-{torch.cuda.get_device_properties(i).uuid}" for i in range(count)]}


@task(cache_policy=NO_CACHE)
def slice_task(alloc_gib: float, iterations: int, rendezvous: Rendezvous | None = None, rank: int = 0,
               size: int = 4096) -> dict[str, Any]:
    """Meet the other ranks of ``rendezvous`` (so all of them held their slices at once), allocate ``alloc_gib`` GiB
    on the task's device, then run ``iterations`` matrix products of ``size``: the lease, what CUDA showed, the bytes
    allocated, the MPS thread percentage the process started with, the products' rate and when it ran
    (``time.monotonic``: one clock for every process of the machine). Allocating past the task's memory cap raises
    torch's OutOfMemoryError, which fails the task."""
    import torch

    start = time.monotonic()
    placed = current_placement()
    enforce(placed)
    if rendezvous is not None:
        rendezvous.join(rank)
    held = torch.ones(int(alloc_gib * GIB), dtype=torch.uint8, device=placed.device)
    tflops, seconds = matmul_rate(placed.device, size, iterations)
    return {**seen_devices(), "rank": rank, "devices": list(placed.gpu_indices), "fraction": placed.fraction,
            "memory_cap": placed.memory_cap, "allocated": int(held.numel()),
            "mps_threads": os.environ.get(MPS_THREADS_ENV), "tflops": tflops, "work_s": seconds, "start": start,
            "end": time.monotonic()}


@salus_job(persistent=LANE_PERSISTENT, ephemeral=LANE_EPHEMERAL)
@task(cache_policy=NO_CACHE)
def lane_job(job: str, iterations: int, rendezvous: Rendezvous, rank: int, hidden: int = 2048, layers: int = 4,
             batch: int = 8192, seed: int = 0) -> dict[str, Any]:
    """A Salus job: an MLP of ``layers`` x ``hidden`` trained with Adam, one step per Salus iteration, so its
    persistent memory (weights, gradients, Adam's two moments, its batch: ~340 MB at the defaults) stays under what
    it declares and each iteration's activations (``batch`` rows) are its ephemeral memory. The jobs meet at
    ``rendezvous`` once built, so neither runs its iterations alone while the other's worker is still starting.
    Returns its iteration spans (wall clock), its lane and budget, the memory held at iteration boundaries and the
    peak."""
    import torch

    placed = current_placement()
    device = torch.device(placed.device)
    torch.manual_seed(seed)
    blocks = [m for _ in range(layers) for m in (torch.nn.Linear(hidden, hidden), torch.nn.ReLU())]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(hidden, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, hidden, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    cuda = device.type == "cuda"  # on a simulated pool (CPU) there is no device memory to read: 0
    spans, held = [], [0]
    rendezvous.join(rank)
    for _ in salus_iterations(iterations):
        begin = time.time()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        held.append(torch.cuda.memory_allocated(device) if cuda else 0)
        spans.append((begin, time.time()))
    lane = placement_lane(placed)
    return {"job": job, "lane": lane.lane_id if lane else -1, "memory_cap": lane.memory_cap if lane else 0,
            "spans": spans, "held_max": max(held), "peak": torch.cuda.max_memory_allocated(device) if cuda else 0,
            "device": placed.device, **seen_devices()}
