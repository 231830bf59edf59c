"""Salus (MLSys 2020; thesis ch. 2): memory lanes and iteration-granular GPU sharing.

Scheduler modules:

- ``controller``: Salus on one device: admit jobs into GPU lanes and switch them at iteration boundaries (thesis Ch
- ``estimates``: how much GPU time a Salus job still needs: its measured iteration time x the iterations it has left
  (§2.4.2)
- ``lanes``: Salus GPU lanes: where a job's ephemeral memory goes (thesis Ch
- ``live``: the live Salus executors of a pool, as ``gpuflows pool`` shows them
- ``overrun``: how long a job may hold its lane's iteration token, and what happens to one that holds it longer
- ``policies``: Salus's iteration schedulers: which job in a lane runs the next iteration (thesis §2.4, §2.5.1)
- ``system``: Salus's entry in the system registry (``gpu.systems``)
"""
