"""Ekya (Bhardwaj et al., NSDI 2022): continuous retraining and inference on shared GPUs.

Scheduler modules:

- ``baselines``: Ekya's baselines: the uniform scheduler and the two ablations of Fig
- ``controller``: Ekya's window controller: one decision loop for the simulator and the continuous-retraining flow
- ``placement``: Turn an Ekya allocation (job -> fraction of the pool) into GPU requests a pool ledger can place
- ``policies``: Ekya's policy families by name: the thief and the baselines of the paper's evaluation
- ``profiler``: Ekya's micro-profiler: predict each retraining config's accuracy and cost from a short trial
- ``system``: Ekya's entry in the system registry (``gpu.systems``)
- ``thief``: Ekya's thief scheduler: which streams retrain, with which config, on what GPU share
"""
