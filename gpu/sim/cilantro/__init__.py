"""Cilantro (Bhardwaj et al., OSDI 2023): online-learned fair allocation rounds.

Simulator modules:

- ``microservices``: Simulator of Cilantro's microservices experiment (thesis ch
- ``run``: Simulator of Cilantro's multi-tenant experiment (thesis ch
- ``scenario``: Scenario parsing for the Cilantro simulator and the static Fig
- ``workloads``: Workloads of the Cilantro multi-tenant experiment (thesis ch
"""
