"""Nona: congestion-aware stochastic placement of DAG inference queries.

Scheduler modules:

- ``baselines``: The schemes Nona is compared with (§IV-A), as θ for ``GroupingSampler`` where they need no live
  state
- ``dag``: Query DAGs for Nona: tasks with compute ops, edges with bytes, contraction, bottlenecks and groupings
- ``optimizer``: Nona's offline optimisation: the bottleneck link as an M/G/1 queue and θ per subgraph (§III-C,
  §III-D, §IV-F)
- ``policy``: Nona's online scheduler: each query's placement sampled from θ, reading no live state (§III-A, §III-C)
"""
