"""FLUID (Salus/FLUID thesis, ch. 3): TrialGroups of hyperparameter trials on a GPU pool.

Simulator modules:

- ``engine``: Discrete-event execution of one tuning job on ``n`` simulated GPUs (the runtime model of thesis Eq
- ``run``: ``gpuflows simulate fluid SCENARIO``: one tuning job under FIFO, StaticFluid and Static+DynamicFluid
- ``workload``: Synthetic trials for the FLUID simulator (thesis Eq
"""
