"""FLUID's entry in the system registry (``gpu.systems`` finds it by scanning ``gpu.schedulers``)."""

from gpu.plugin import System

SYSTEM = System(
    name="fluid",
    paper="Yu, FLUID (Salus/FLUID thesis, ch. 3)",
    controller="gpu.schedulers.fluid.controller:FluidExecutor",
    example="scenarios/fluid/toy.yaml",
    flows=("flows.trial_groups",),
)
