"""ESCHER's policies by name (thesis ch. 4, §4.4–§4.6): one set for every place that names them.

The simulator's experiments (``gpu.sim.escher.run``), the flow's demos (``flows.escher_policies``) and a
``SchedulerPolicy(system="escher")`` all take these names; ``tests/sim/test_escher_sim.py`` checks that they agree.
"""

POLICIES = ("affinity", "gang", "hfs", "locality", "colocation", "tune")
