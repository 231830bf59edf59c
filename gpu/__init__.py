"""gpuflows engine: devices, the pool ledger, schedulers and simulators.

Importable without Prefect, Ray, MLflow or torch: the Prefect shells in ``tasks/`` and
``flows/`` import this package, never the reverse.
"""
