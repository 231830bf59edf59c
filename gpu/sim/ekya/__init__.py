"""Ekya (Bhardwaj et al., NSDI 2022): continuous retraining and inference on shared GPUs.

Simulator modules:

- ``run``: Trace-driven simulator for Ekya (thesis §2.5): policies retrain and serve streams window by window
- ``scenario``: The Ekya scenario format (docs/ekya.md): a pool, a window, and per-stream, per-window profiles
- ``workloads``: Seeded synthetic Ekya workloads shaped like the paper's evaluation (thesis §2.6)
"""
