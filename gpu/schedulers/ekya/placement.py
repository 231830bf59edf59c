"""Turn an Ekya allocation (job -> fraction of the pool) into GPU requests a pool ledger can place.

Ekya allocates fractions of a pooled ``G`` GPUs (thesis §2.4, MPS-shared fractions); a ledger places
requests on physical devices, where a request < 1 GPU shares one device and a request >= 1 GPU
takes whole devices (``gpu.placement.ResourceRequest``). The rounding rule (ours; the paper does not place fractions), chosen so the sum
never exceeds the pool and every device holds at most 1.0 GPU:

1. ``gpus = share * pool_gpus``, rounded down to ``step`` (default 0.01 GPU).
2. Jobs with ``gpus >= 1`` get ``floor(gpus)`` whole devices (largest first); the fraction above the
   whole number is dropped (it stays free).
3. Fractional jobs are placed first-fit-decreasing on the remaining capacity of the devices; a job
   that fits nowhere is shrunk to the largest free capacity left on one device (possibly 0).

Example::

    >>> [(r.job, r.gpus, r.devices) for r in to_gpu_requests({"A/infer": 0.5, "A/train": 0.25}, 2)]
    [('A/infer', 1.0, (0,)), ('A/train', 0.5, (1,))]

A flow turns each into ``ResourceRequest(gpus=r.gpus, label=r.job)`` for the ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from gpu.errors import ConfigError


@dataclass(frozen=True)
class GpuRequest:
    """GPUs for one job and the devices (indices into the pool) the plan puts it on."""

    job: str
    gpus: float
    devices: tuple[int, ...]


def to_gpu_requests(shares: Mapping[str, float], pool_gpus: int, step: float = 0.01) -> tuple[GpuRequest, ...]:
    """Per-job GPU requests (GPU units) for ``shares`` (job -> fraction of a ``pool_gpus`` pool)."""
    if isinstance(pool_gpus, bool) or not isinstance(pool_gpus, int) or pool_gpus < 0:
        raise ConfigError("pool_gpus", pool_gpus, "must be a whole number of devices >= 0")
    if not 0 < step <= 1:
        raise ConfigError("step", step, "must be in (0, 1]")
    for job, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not share >= 0:
            raise ConfigError(f"shares[{job}]", share, "must be a number >= 0")
    if sum(shares.values()) > 1 + 1e-6:
        raise ConfigError("shares", dict(shares), "add up to more than the whole pool")
    per_gpu = round(1 / step)  # integer units per device, so the packing is exact
    want = {job: int(math.floor(share * pool_gpus * per_gpu + 1e-6)) for job, share in shares.items()}
    free = [per_gpu] * pool_gpus
    placed: dict[str, tuple[int, tuple[int, ...]]] = {}
    next_whole = 0
    for job in sorted((j for j in want if want[j] >= per_gpu), key=lambda j: -want[j]):
        n = want[job] // per_gpu
        devices = tuple(range(next_whole, next_whole + n))
        next_whole += n
        for dev in devices:
            free[dev] = 0
        placed[job] = (n * per_gpu, devices)
    for job in sorted((j for j in want if want[j] < per_gpu), key=lambda j: -want[j]):
        fits = [dev for dev in range(pool_gpus) if free[dev] >= want[job]]
        dev = fits[0] if fits else max(range(pool_gpus), key=lambda k: free[k], default=None)
        if dev is None or want[job] == 0:
            placed[job] = (0, ())
            continue
        amount = min(want[job], free[dev])
        free[dev] -= amount
        placed[job] = (amount, (dev,) if amount else ())
    return tuple(GpuRequest(job, placed[job][0] / per_gpu, placed[job][1]) for job in shares)
