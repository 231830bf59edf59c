"""Prefect tasks and the GPU-aware task runners that place them on a pool."""
