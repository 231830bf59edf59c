"""gpuflows' Prefect flows, each runnable as ``python -m flows.<name>`` and deployed from ``prefect.yaml``.

Each flow runs one or more systems, and each system's registry entry names its flows
(``gpu/schedulers/<system>/system.py``, ``flows=``), except two that run no system: ``pool_demo`` (the GPU task
runner placing plain torch tasks on pool slices) and ``demo`` (``make demo``: ``pool_demo``, then Ekya's
``continuous_retraining`` with the thief against a uniform baseline). ``tests/test_systems.py`` keeps the two lists
true.

One Prefect home for every entry point: importing this package (``python -m flows.<name>``, ``gpuflows demo``,
a script importing a flow) before Prefect sets ``PREFECT_HOME`` to ``<state folder>/prefect`` — ``./.state/prefect``,
or ``$GPUFLOWS_STATE_DIR/prefect`` — when it is unset (``gpu.state.default_prefect_home``; ``tasks``,
``resource_blocks`` and ``gpuflows`` do the same): the folder the Makefile exports for ``make demo``,
``make server`` (the UI) and ``make worker``. Runs on the embedded (temporary) server land in that home's database,
so the UI that ``make server`` starts shows them. An explicit ``PREFECT_HOME`` (or ``PREFECT_API_URL``) wins.
Usage telemetry of the embedded server and MLflow is off unless the user set ``PREFECT_SERVER_ANALYTICS_ENABLED``
or ``MLFLOW_DISABLE_TELEMETRY``.
"""

from __future__ import annotations

import os

from gpu.state import default_prefect_home


def _quiet_telemetry() -> None:
    # The embedded Prefect server and MLflow report usage home; offline (the GPU boxes) that fails with an
    # ERROR line in every run. A value the user set wins.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


default_prefect_home()
_quiet_telemetry()
