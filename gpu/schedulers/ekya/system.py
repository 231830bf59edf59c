"""Ekya's entry in the system registry (``gpu.systems`` finds it by scanning ``gpu.schedulers``)."""

from gpu.plugin import System

SYSTEM = System(
    name="ekya",
    paper="Bhardwaj et al., Ekya, NSDI 2022",
    controller="gpu.schedulers.ekya.controller:EkyaController",
    example="scenarios/ekya/table_2_1.yaml",
    flows=("flows.continuous_retraining",),
)
