"""Opening the shared ledger of a named pool on this machine, and reading what pools there are.

Every process that opens pool ``name`` gets the same SQLite file under the state folder, so
concurrent flow runs and deployments share one ledger and never over-commit a device.
"""

from __future__ import annotations

import json
import re
import socket
import sqlite3
from collections import Counter
from contextlib import closing
from dataclasses import dataclass

from gpu.devices import Device, Node, PoolSpec, discover, nvml_devices
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger
from gpu.ledger_file import unwritable
from gpu.placement import PlacementPolicy
from gpu.state import state_dir
from gpu.units import format_memory


def pool_path(name: str):
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ConfigError("pool name", name, "use letters, digits, '.', '_' and '-' only")
    return state_dir() / "pools" / f"{name}.sqlite"


def pool_names() -> list[str]:
    """The pools that have a ledger on this machine."""
    return sorted(p.stem for p in (state_dir() / "pools").glob("*.sqlite"))


@dataclass(frozen=True)
class StoredPool:
    """A pool as its ledger file stores it. ``leases`` counts every recorded lease, those of crashed processes
    too until a ledger opened on the pool reclaims them."""

    name: str
    spec: PoolSpec
    leases: int
    waiting: int

    def layout(self) -> str:
        """E.g. ``host: 2 x 16GiB, 8 CPUs``."""
        nodes = []
        for n in self.spec.nodes:
            sizes = Counter(d.memory_total for d in n.devices)
            gpus = " + ".join(f"{k} x {format_memory(m)}" for m, k in sizes.items()) or "no GPUs"
            nodes.append(f"{n.name}: {gpus}, {n.cpus:g} CPUs")
        return "; ".join(nodes)


def read_pool(name: str) -> StoredPool:
    """Pool ``name`` read from its ledger without opening the ledger, which would write its own layout over the
    stored one. An unknown name is an error listing the pools: a misspelt name must not create an empty pool."""
    path = pool_path(name)
    if not path.is_file():
        raise ConfigError("pool", name, f"no such pool; the pools here are {pool_names() or 'none yet'}")
    try:
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT value FROM meta WHERE key='spec'").fetchone()
            leases, = db.execute("SELECT COUNT(*) FROM leases").fetchone()
            waiting, = db.execute("SELECT COUNT(*) FROM tickets").fetchone()
        spec = _stored_spec(json.loads(row[0]))
    except (sqlite3.Error, ValueError, TypeError) as exc:  # TypeError: no 'spec' row or not the stored shape
        raise ConfigError("pool", name, f"its ledger {path} cannot be read ({unwritable(str(path)) or exc})") from exc
    return StoredPool(name, spec, leases, waiting)


def _stored_spec(nodes: list) -> PoolSpec:
    """The ledger stores ``[[node, cpus, [[index, memory], ...]], ...]``. A device that this machine's NVML reports
    at that index with that memory is that GPU; any other is simulated (its tasks run on the CPU)."""
    host = socket.gethostname()
    nvml = {(d.index, d.memory_total): d for d in nvml_devices()}
    return PoolSpec(tuple(
        Node(node, tuple((nvml.get((i, mem)) if node == host else None)
                         or Device(i, f"SIM-{node}-{i}", "Simulated GPU", mem, mem, simulated=True)
                         for i, mem in devices), float(cpus))
        for node, cpus, devices in nodes))


def open_pool(name: str = "default", spec: PoolSpec | None = None, simulated: str | None = None,
              backend: str = "auto", policy: PlacementPolicy | None = None, shared: bool = True,
              lease_ttl: float = 30.0) -> PoolLedger:
    """The ledger of pool ``name``: shared through a file when ``shared``, else private in memory.

    Its layout is ``spec``, else the devices ``discover(simulated, backend)`` finds (an idle ledger takes it
    over). With neither, the pool must exist and keeps its stored layout (``read_pool``): looking at a pool
    must not reshape it.
    """
    if spec is None and simulated is None:
        spec = read_pool(name).spec
    spec = spec or discover(simulated, backend)
    return PoolLedger(spec, pool_path(name) if shared else None, policy=policy, lease_ttl=lease_ttl)
