"""Where gpuflows keeps local state (pool ledgers, the MLflow database, flow checkpoints, the Prefect home).

One project-local folder, ``./.state`` by default, overridable with ``GPUFLOWS_STATE_DIR``
(tests point it at a temporary folder).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpu.errors import ConfigError


def state_dir() -> Path:
    """The state folder, created if missing (a folder that cannot be created is a configuration error)."""
    path = Path(os.environ.get("GPUFLOWS_STATE_DIR") or Path.cwd() / ".state").resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("GPUFLOWS_STATE_DIR", str(path), f"the state folder cannot be created: {exc.strerror}") from exc
    return path


def prefect_home() -> Path:
    """The one Prefect home of every entry point: ``<state folder>/prefect`` (``./.state/prefect``; the Makefile
    exports it, ``pyproject.toml``'s ``[tool.prefect]`` names it for ``prefect`` commands run in the checkout)."""
    return state_dir() / "prefect"


def default_prefect_home() -> bool:
    """Point ``PREFECT_HOME`` at ``prefect_home()`` when it is unset and Prefect is not loaded yet; True if it is
    (or already was) the project's home, False when Prefect was loaded first with a home of its own.

    Called by every gpuflows package a user imports (``flows``, ``tasks``, ``resource_blocks``, ``gpuflows``),
    so a script's runs land where ``make server`` shows them. Prefect fixes its home when it is first imported;
    changing the variable later would split this process from its task worker processes. Only an environment
    variable is set here: the engine imports no Prefect."""
    if os.environ.get("PREFECT_HOME"):
        return True
    if "prefect" in sys.modules:
        return False
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)  # Prefect creates its home but not the parents
    os.environ["PREFECT_HOME"] = str(home)
    return True
