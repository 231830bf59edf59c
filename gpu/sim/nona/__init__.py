"""Nona: congestion-aware stochastic placement of DAG inference queries.

Simulator modules:

- ``engine``: The network-aware cluster Nona is evaluated in (§IV-A): servers and one bottleneck link, on
  ``EventLoop``
- ``run``: ``gpuflows simulate nona SCENARIO``: DAG inference queries on a cluster with one bottleneck link (§IV)
- ``workloads``: The query classes of Nona's evaluation (§IV-A, Table II), as measured on this machine, and §II's query
"""
