"""Nexus's entry in the system registry (``gpu.systems`` finds it by scanning ``gpu.schedulers``).

Its dispatch batch policies (§6.3, ``batching.py``) are the serving runtime's default ones: every
``tasks/serving`` worker and both serving simulators build them by these names.
"""

from gpu.plugin import System

SYSTEM = System(
    name="nexus",
    paper="Shen et al., Nexus, SOSP 2019",
    controller="gpu.schedulers.nexus.controller:NexusController",
    example="scenarios/nexus/table2_toy.yaml",
    flows=("flows.serving_rollout",),
    batch_policies={
        "early_drop": "gpu.schedulers.nexus.batching:EarlyDropPolicy",
        "lazy_drop": "gpu.schedulers.nexus.batching:LazyDropPolicy",
        "fixed_batch": "gpu.schedulers.nexus.batching:FixedBatchPolicy",
        "nexus_planned": "gpu.schedulers.nexus.planned:NexusPlanned",
    },
)
