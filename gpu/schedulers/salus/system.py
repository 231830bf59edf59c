"""Salus's entry in the system registry (``gpu.systems`` finds it by scanning ``gpu.schedulers``).

Besides its own flow, Salus is the ``salus`` executor of Ekya's and FLUID's flows (``tasks/salus``).
"""

from gpu.plugin import System

SYSTEM = System(
    name="salus",
    paper="Yu, Salus (Salus/FLUID thesis, ch. 2; MLSys 2020)",
    controller="gpu.schedulers.salus.controller:SalusController",
    example="scenarios/salus/fair_three_jobs.yaml",
    flows=("flows.gpu_sharing", "flows.continuous_retraining", "flows.trial_groups"),
)
