"""Cilantro's entry in the system registry (``gpu.systems`` finds it by scanning ``gpu.schedulers``)."""

from gpu.plugin import System

SYSTEM = System(
    name="cilantro",
    paper="Bhardwaj et al., Cilantro, OSDI 2023",
    controller="gpu.schedulers.cilantro.controller:CilantroRound",
    example="scenarios/cilantro/small.yaml",
    flows=("flows.allocation_rounds",),
)
