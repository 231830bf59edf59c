"""Salus (MLSys 2020; thesis ch. 2): memory lanes and iteration-granular GPU sharing.

Simulator modules:

- ``engine``: The Salus simulator's world: jobs iterate on one device under a ``SalusController`` (thesis Ch
- ``run``: ``gpuflows simulate salus SCENARIO``: one device's job trace under FIFO, SRTF, PACK and FAIR (thesis
  §2.5.1)
- ``workloads``: Table A.1-like workloads and a seeded Tiresias-like job trace for the Salus simulator (thesis §2.5,
  App
"""
