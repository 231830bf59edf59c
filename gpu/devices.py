"""GPU discovery: real devices through NVML (nvidia-ml-py), simulated ones from configuration.

No driver or no GPU is a normal situation (CI, laptops): ``discover`` then falls back to the
simulated devices it is given, and says so in one log line.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass, field

from gpu.errors import ConfigError
from gpu.units import format_memory, parse_memory

log = logging.getLogger("gpuflows.devices")


@dataclass(frozen=True)
class Device:
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_free: int
    utilization: float = 0.0  # percent, from NVML; 0 for simulated devices
    simulated: bool = False

    def describe(self) -> str:
        kind = "simulated" if self.simulated else "nvml"
        return (f"gpu{self.index} {self.name} [{kind}] {format_memory(self.memory_total)} total, "
                f"{format_memory(self.memory_free)} free, util {self.utilization:.0f}%, {self.uuid}")


@dataclass(frozen=True)
class Node:
    name: str
    devices: tuple[Device, ...]
    cpus: float


@dataclass(frozen=True)
class PoolSpec:
    """The pool's physical shape: nodes, their devices and CPUs."""

    nodes: tuple[Node, ...] = field(default_factory=tuple)

    @property
    def simulated(self) -> bool:
        return any(d.simulated for n in self.nodes for d in n.devices)

    @property
    def gpu_count(self) -> int:
        return sum(len(n.devices) for n in self.nodes)


_SIM = re.compile(r"^\s*(\d{1,9})\s*[xX*]\s*([0-9.]{1,20}\s*[A-Za-z]*)\s*$")
MAX_SIMULATED = 1024  # devices per node: every one is an object, a ledger row and a line of output
MIN_DEVICE_MEMORY, MAX_DEVICE_MEMORY = 2**20, 2**40  # 1 MiB .. 1 TiB: anything else is a typo ('1x1B', '1x16TB')


def parse_simulated(spec: str, node: str | None = None, cpus: float | None = None) -> Node:
    """A node of simulated devices from a spec like ``"4x16GiB"`` (count x memory), within the bounds above."""
    m = _SIM.match(spec or "") if isinstance(spec, str) else None
    if not m:
        raise ConfigError("simulated", spec, "expected COUNT x MEMORY, e.g. '4x16GiB'")
    count, memory = int(m.group(1)), parse_memory(m.group(2), "simulated")
    if count > MAX_SIMULATED:
        raise ConfigError("simulated", spec, f"at most {MAX_SIMULATED} devices per node")
    if not MIN_DEVICE_MEMORY <= memory <= MAX_DEVICE_MEMORY:
        raise ConfigError("simulated", spec, f"device memory must be between {format_memory(MIN_DEVICE_MEMORY)} "
                                             f"and {format_memory(MAX_DEVICE_MEMORY)}")
    name = node or socket.gethostname()
    devices = tuple(
        Device(i, f"SIM-{name}-{i}", "Simulated GPU", memory, memory, simulated=True) for i in range(count)
    )
    return Node(name, devices, float(cpus if cpus is not None else os.cpu_count() or 1))


def simulated_nodes(spec: str, nodes: int, cpus: float | None = None, prefix: str = "node") -> PoolSpec:
    """A pool of ``nodes`` simulated nodes ``<prefix>0 .. <prefix>N-1``, each with ``spec``'s devices
    (e.g. ``simulated_nodes("4x16GiB", 3)``): multi-node placement (affinity, anti-affinity, gangs
    across nodes) tried on one machine."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_SIMULATED:
        raise ConfigError("nodes", nodes, f"must be a whole number of nodes from 1 to {MAX_SIMULATED}")
    return PoolSpec(tuple(parse_simulated(spec, f"{prefix}{i}", cpus) for i in range(nodes)))


def nvml_devices() -> tuple[Device, ...]:
    """The GPUs NVML reports; empty when there is no driver or no GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError: no library, no driver, no device
        log.debug("NVML unavailable: %s", exc)
        return ()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                util = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except pynvml.NVMLError:
                util = 0.0
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            out.append(Device(i, uuid if isinstance(uuid, str) else uuid.decode(),
                              name if isinstance(name, str) else name.decode(),
                              int(mem.total), int(mem.free), util))
        return tuple(out)
    finally:
        pynvml.nvmlShutdown()


def nvml_utilization() -> dict[int, float]:
    """Current utilisation (percent) per NVML device index; empty without NVML."""
    return {d.index: d.utilization for d in nvml_devices()}


def nvml_readings() -> dict[int, tuple[float, float]]:
    """(utilisation percent, memory in use MiB) per NVML device index; empty without NVML (no GPU)."""
    return {d.index: (d.utilization, (d.memory_total - d.memory_free) / 2**20) for d in nvml_devices()}


def discover(simulated: str | None = "2x16GiB", backend: str = "auto", cpus: float | None = None) -> PoolSpec:
    """This machine's pool: NVML GPUs when present (backend 'auto' or 'nvml'), else simulated ones.

    ``backend='simulated'`` forces the simulated devices even on a GPU machine (tests, dry runs);
    ``backend='nvml'`` fails when no GPU is found instead of falling back.
    """
    if backend not in ("auto", "nvml", "simulated"):
        raise ConfigError("backend", backend, "choose 'auto', 'nvml' or 'simulated'")
    host = socket.gethostname()
    ncpu = float(cpus if cpus is not None else os.cpu_count() or 1)
    if backend != "simulated":
        found = nvml_devices()
        if found:
            log.info("gpuflows pool: %d NVML GPU(s) on %s (%s)", len(found), host, found[0].name)
            return PoolSpec((Node(host, found, ncpu),))
        if backend == "nvml":
            raise ConfigError("backend", backend, "NVML found no GPU on this machine")
    node = parse_simulated(simulated or "0x1GiB", host, ncpu)
    log.info("gpuflows pool: no NVML GPU in use; simulating %d device(s) of %s on %s",
             len(node.devices), format_memory(node.devices[0].memory_total) if node.devices else "-", host)
    return PoolSpec((node,))
