"""ORLOJ's entry in the system registry (``gpu.systems`` finds it by scanning ``gpu.schedulers``).

ORLOJ serves through the serving rollout with ``batch_policy: orloj`` (its workers re-profile every epoch,
``tasks/serving/epochs.py``). It declares its batch policy and its Clockwork- and Clipper-like baselines (§4.5);
the Nexus baseline is Nexus's own planned runtime, ``nexus_planned``, declared by Nexus.
"""

from gpu.plugin import System

SYSTEM = System(
    name="orloj",
    paper="Yu, ORLOJ (PhD thesis, U. Michigan 2022, ch. 4)",
    controller="gpu.schedulers.orloj.controller:OrlojController",
    example="scenarios/orloj/small.yaml",
    flows=("flows.serving_rollout",),
    batch_policies={
        "orloj": "gpu.schedulers.orloj.policy:OrlojPolicy",
        "clockwork": "gpu.schedulers.orloj.baselines:ClockworkLike",
        "clipper": "gpu.schedulers.orloj.baselines:ClipperLike",
    },
)
