"""ESCHER's entry in the system registry (``gpu.systems`` finds it by scanning ``gpu.schedulers``).

Besides its own flow's demos, ESCHER places FLUID's trials in ``flows.trial_groups`` (``tasks/fluid/escher.py``).
"""

from gpu.plugin import System

SYSTEM = System(
    name="escher",
    paper="Bhardwaj, ESCHER: Expressive Scheduling with Ephemeral Resources, SoCC 2021 (thesis ch. 4)",
    controller="gpu.schedulers.escher.controller:HierarchicalFairShare",
    example="scenarios/escher/small.yaml",
    flows=("flows.escher_policies", "flows.trial_groups"),
)
