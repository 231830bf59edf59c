"""Where gpuflows keeps local state (pool ledgers, the MLflow database, flow checkpoints).

One project-local folder, ``./.state`` by default, overridable with ``GPUFLOWS_STATE_DIR``
(tests point it at a temporary folder).
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    path = Path(os.environ.get("GPUFLOWS_STATE_DIR") or Path.cwd() / ".state").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path
