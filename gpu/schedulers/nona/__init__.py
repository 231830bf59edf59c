"""Nona: congestion-aware stochastic placement of DAG inference queries.

Scheduler modules:

- ``baselines``: The schemes Nona is compared with (§IV-A), as θ for ``GroupingSampler`` where they need no live
  state
- ``controller``: Nona's online scheduler, each query's placement sampled from θ (``GroupingSampler``,
  ``NonaController``, ``NonaRouting``; §III-A, §III-C)
- ``dag``: Query DAGs for Nona: tasks with compute ops, edges with bytes, contraction, bottlenecks and groupings
- ``optimizer``: Nona's offline optimisation: the bottleneck link as an M/G/1 queue and θ per subgraph (§III-C,
  §III-D, §IV-F)
- ``policies``: ``POLICIES``, Nona and the schemes it is compared with (§IV-A), by name
- ``system``: Nona's entry in the system registry (``gpu.systems``)
"""
