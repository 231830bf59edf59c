"""Nexus (Shen et al., SOSP 2019): squishy bin packing, epochs, routing and query chaining.

Simulator modules:

- ``engine``: InferenceRequest-level simulation of a Nexus plan: arrivals, routing, per-GPU round-robin, batch
  policy, drops
- ``epochs``: Epoch reaction (Nexus Fig
- ``run``: ``gpuflows simulate nexus``: plan a scenario's sessions and queries, then simulate every policy on it
"""
