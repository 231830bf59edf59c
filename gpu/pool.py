"""Opening the shared ledger of a named pool on this machine.

Every process that opens pool ``name`` gets the same SQLite file under the state folder, so
concurrent flow runs and deployments share one ledger and never over-commit a device.
"""

from __future__ import annotations

import re

from gpu.devices import PoolSpec, discover
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger
from gpu.placement import PlacementPolicy
from gpu.state import state_dir


def pool_path(name: str):
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
        raise ConfigError("pool name", name, "use letters, digits, '.', '_' and '-' only")
    return state_dir() / "pools" / f"{name}.sqlite"


def open_pool(name: str = "default", spec: PoolSpec | None = None, simulated: str = "2x16GiB",
              backend: str = "auto", policy: PlacementPolicy | None = None, shared: bool = True,
              lease_ttl: float = 30.0) -> PoolLedger:
    """The ledger of pool ``name``: shared through a file when ``shared``, else private in memory."""
    spec = spec or discover(simulated, backend)
    return PoolLedger(spec, pool_path(name) if shared else None, policy=policy, lease_ttl=lease_ttl)
