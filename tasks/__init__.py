"""The flow side of gpuflows: a runtime that names no system, reporting, and one folder per system's torch work.

- ``tasks.runtime``: the GPU-aware Prefect task runners (local threads/processes, Ray) and their admission seam,
  task requests and placements, slices, MLflow tracking and what every flow does the same way. It names no system.
- ``tasks.report``: charts, tables and progress in the Prefect UI, the pool's occupancy, and the one way every
  system publishes its MLflow records (``tasks.report.records``). It names no system.
- ``tasks.salus`` and ``tasks.serving``: substrates other systems build on (co-location of jobs in a
  device's memory lanes; the Nexus/ORLOJ/Nona serving runtime). They never import a system back.
- ``tasks.<system>`` (``ekya``, ``cilantro``, ``fluid``, ``escher``, ``nona``): one system's real work, its
  records (``records.py``) and charts; independent of each other.
- ``tasks.digits``: the bundled digits data and MLP several systems train.

The import rules are written in ``docs/architecture.md`` ("Layers and import rules") and checked by
``lint-imports`` in ``make test``.
"""

from gpu.state import default_prefect_home

default_prefect_home()  # a script importing tasks/gpuflows before Prefect: its runs land where `make server` looks
