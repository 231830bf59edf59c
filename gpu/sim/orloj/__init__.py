"""ORLOJ (thesis ch. 4): distribution-aware batching for dynamic DNNs.

Simulator modules:

- ``batch_cost``: measured batch costs (``tasks.serving.batch_costs``'s table) as the simulator's batch model
- ``run``: ``gpuflows simulate orloj``: one GPU worker serving a dynamic DNN, ORLOJ against its baselines (thesis
  §4.5)
- ``workload``: ORLOJ simulator inputs: per-application execution-time distributions and the scenario file
"""
