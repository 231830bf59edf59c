"""Nona's entry in the system registry (``gpu.systems`` finds it by scanning ``gpu.schedulers``).

Nona serves through the serving rollout with ``placement: nona`` (or a baseline's name), deployed as
``serving-rollout-nona`` (``tasks/serving/nona.py``).
"""

from gpu.plugin import System

SYSTEM = System(
    name="nona",
    paper="Pit-Claudel et al., Nona: congestion-aware stochastic scheduling of inference queries",
    controller="gpu.schedulers.nona.controller:NonaController",
    example="scenarios/nona/motivating.yaml",
    flows=("flows.serving_rollout",),
)
