"""Where gpuflows keeps local state (pool ledgers, the MLflow database, flow checkpoints).

One project-local folder, ``./.state`` by default, overridable with ``GPUFLOWS_STATE_DIR``
(tests point it at a temporary folder).
"""

from __future__ import annotations

import os
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
