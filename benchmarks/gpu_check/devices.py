"""Check 1: NVML discovery (``gpu.devices``) and torch agree on this machine's GPUs; ``gpuflows devices`` lists them.

The pool is built from NVML's view (index, UUID, memory) while tasks reach their devices through CUDA with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``: index i must be the same device to both (same UUID), with the same memory
(NVML counts a little the CUDA runtime does not hand out: within ``MEMORY_TOLERANCE``). ``python -m gpuflows.cli
devices`` must list every NVML device as ``[nvml]`` with its UUID.
"""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.report import Outcome, verdict
from gpu.devices import Device, nvml_devices

MEMORY_TOLERANCE = 0.02


def torch_devices() -> list[tuple[str, int]]:
    """(UUID in NVML's form, total memory) of each device torch sees, in its index order."""
    import torch

    return [(f"GPU-{p.uuid}", p.total_memory) for p in map(torch.cuda.get_device_properties,
                                                                range(torch.cuda.device_count()))]


def check(settings: Settings) -> Outcome:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    listed = subprocess.run([sys.executable, "-m", "gpuflows.cli", "devices"], capture_output=True, text=True,
                            timeout=120)
    return judge(nvml_devices(), torch_devices(), listed.stdout, os.environ.get("CUDA_VISIBLE_DEVICES"))


def judge(nvml: list[Device] | tuple[Device, ...], seen: list[tuple[str, int]], listing: str,
          visible: str | None) -> Outcome:
    """Same count, same UUID at each index, memory within the tolerance, every device in the CLI's listing."""
    failures = []
    if not nvml:
        failures.append("NVML lists no device")
    if len(seen) != len(nvml):
        failures.append(f"torch sees {len(seen)} device(s), NVML {len(nvml)} (CUDA_VISIBLE_DEVICES={visible})")
    mismatched = [d.index for d, (uuid, _) in zip(nvml, seen) if uuid.lower() != d.uuid.lower()]
    if mismatched:
        first = mismatched[0]
        failures.append(f"index {first} is {seen[first][0]} to torch, {nvml[first].uuid} to NVML")
    gaps = [abs(total - d.memory_total) / d.memory_total for d, (_, total) in zip(nvml, seen)]
    if gaps and max(gaps) > MEMORY_TOLERANCE:
        failures.append(f"memory differs by {100 * max(gaps):.1f}% between NVML and torch")
    lines = [line for line in listing.splitlines() if "[nvml]" in line]
    unlisted = [d.uuid for d in nvml if not any(d.uuid in line for line in lines)]
    if unlisted:
        failures.append(f"`gpuflows devices` does not list {unlisted}")
    first = nvml[0] if nvml else None
    figure = (f"{len(nvml)} x {first.name if first else '-'}, {first.memory_total / 2**30 if first else 0:.1f} GiB; "
              f"torch sees {len(seen)}, UUIDs {'match' if not mismatched else 'differ'}, memory within "
              f"{100 * max(gaps, default=0):.2f}%; `gpuflows devices` lists {len(lines)}")
    figures = {"count": len(nvml), "torch_count": len(seen), "name": first.name if first else "",
               "memory_gib": [d.memory_total / 2**30 for d in nvml], "memory_gap_max": max(gaps, default=0.0),
               "uuids_match": not mismatched, "listed": len(lines)}
    return verdict("devices", failures, figure, figures)
