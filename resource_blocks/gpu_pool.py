"""The GPU pool a flow's tasks are placed on."""

from __future__ import annotations

from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field, field_validator

from gpu.devices import discover, parse_simulated, simulated_nodes
from gpu.pool import open_pool
from gpu.scenario import MAX_SECONDS
from resource_blocks._defaults import load_or_default

MAX_NODES = 64  # simulated nodes of one pool
MACHINE_POOL = "default"
"""The one pool of a machine's real GPUs: every flow's default pool on NVML devices, and ``GpuPool()``'s name."""


class GpuPool(Block):
    """Which GPUs to place tasks on: NVML devices when present, else simulated ones.

    Flow runs that name the same pool share one ledger (a SQLite file on this machine, a named
    actor on a Ray cluster), so concurrent deployments never over-commit a device.
    """

    _block_type_name = "gpuflows GPU pool"
    _description = "GPU pool for gpuflows task runners (NVML or simulated devices, local or Ray)."

    name: str = Field(default="default", description="Pool name; flows naming the same pool share its ledger.")
    device_backend: Literal["auto", "nvml", "simulated"] = Field(
        default="auto", description="'auto' uses NVML GPUs when found, else the simulated devices.")
    simulated: str = Field(default="2x16GiB", description="Simulated devices as COUNT x MEMORY.")
    nodes: int = Field(default=1, ge=1, le=MAX_NODES, description="Simulated nodes node0..node<N-1>, each with the "
                       "'simulated' devices (more than 1: always simulated; ESCHER's multi-node placement).")
    shared: bool = Field(default=True, description="Share the ledger across processes (else private, in memory).")
    ray_address: str | None = Field(default=None, description="Ray cluster address for the Ray backend (None: local Ray).")
    lease_ttl_s: float = Field(default=30.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False,
                               description="Seconds without heartbeat before a lease is reclaimed.")

    @field_validator("simulated")
    @classmethod
    def _devices(cls, spec: str) -> str:
        """COUNT x MEMORY within ``gpu.devices``' bounds, and at least one device: a pool of none holds no task."""
        if not parse_simulated(spec).devices:
            raise ValueError(f"simulated={spec!r}: a pool needs at least one device")
        return spec

    @classmethod
    def load_or_default(cls, name: str | None = None) -> "GpuPool":
        return load_or_default(cls, name)

    def on_this_machine(self) -> "GpuPool":
        """A flow's own default pool as this machine runs it: on simulated devices its own name (each simulated
        pool is a world of its own), on real GPUs (NVML, backend ``auto`` or ``nvml``) the machine-wide pool
        ``MACHINE_POOL``. A GPU has one ledger on a machine (``gpu.claims`` refuses a second), so flows started
        side by side share that ledger and queue on it instead of the second failing on its claim."""
        if self.name == MACHINE_POOL or self.nodes > 1 or self.device_backend == "simulated":
            return self
        spec = discover(self.simulated, self.device_backend)
        real = any(not d.simulated for node in spec.nodes for d in node.devices)
        return self.model_copy(update={"name": MACHINE_POOL}) if real else self

    def open_ledger(self, policy=None):
        """The pool's ledger on this machine (see ``gpu.pool.open_pool``)."""
        spec = simulated_nodes(self.simulated, self.nodes) if self.nodes > 1 else None
        return open_pool(self.name, spec=spec, simulated=self.simulated, backend=self.device_backend, policy=policy,
                         shared=self.shared, lease_ttl=self.lease_ttl_s)
