"""The flow side of gpuflows: a runtime that names no system, reporting, and one folder per system's torch work.

- ``tasks.runtime``: the GPU-aware Prefect task runners (local threads/processes, Ray), task requests and
  placements, slices, MLflow tracking and what every flow does the same way. It names no system.
- ``tasks.report``: charts, Prefect artifacts and progress, and the MLflow records every system publishes.
- ``tasks.salus`` and ``tasks.serving``: substrates other systems build on (co-location of jobs in a
  device's memory lanes; the Nexus/ORLOJ/Nona serving runtime). They never import a system back.
- ``tasks.<system>`` (``ekya``, ``cilantro``, ``fluid``, ``escher``, ``nona``): one system's real work and its
  records; independent of each other.
- ``tasks.digits``: the bundled digits data and MLP several systems train.

The import rules are written in ``docs/architecture.md`` and checked by ``lint-imports`` in ``make test``.
"""
