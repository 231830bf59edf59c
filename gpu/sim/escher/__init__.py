"""ESCHER (SoCC 2021): scheduling policies as libraries over ephemeral resources.

Simulator modules:

- ``affinity``: Table 4.2's anti-affinity and affinity rows in simulation (thesis §4.4, P3 and P1)
- ``gangs``: Fig
- ``ledger``: The simulator's scheduler for ESCHER: a ledger in memory, matching through ``gpu.placement``
- ``run``: ``gpuflows simulate escher SCENARIO``: ESCHER's evaluation (thesis §4.6) on the simulated cluster
- ``workloads``: ESCHER's application experiments in simulation (thesis §4.6): WordCount locality (Fig
- ``world``: The simulated world ESCHER's ESLs run in: an ``EventLoop`` clock, a ``SimLedger`` scheduler, tasks
"""
