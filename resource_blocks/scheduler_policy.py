"""Scheduler-policy settings that flows read; the policy logic lives in ``gpu/``."""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from pydantic import Field

from resource_blocks._defaults import load_or_default


class SchedulerPolicy(Block):
    """A named policy of one system plus its parameters, e.g. ``system='ekya', policy='thief',
    params={'delta': 0.1}``. The placement policy of the task runner is ``system='pool'``
    (``fifo`` or ``fifo-backfill``)."""

    _block_type_name = "gpuflows scheduler policy"
    _description = "Which scheduler policy a gpuflows flow uses, with its parameters."

    system: str = Field(default="pool", description="System the policy belongs to (pool, ekya, fluid, cilantro, nexus).")
    policy: str = Field(default="fifo", description="Policy name within the system.")
    params: dict[str, Any] = Field(default_factory=dict, description="Policy parameters.")

    @classmethod
    def load_or_default(cls, name: str | None = None) -> "SchedulerPolicy":
        return load_or_default(cls, name)

    def placement_policy(self):
        """The task runner's placement policy when ``system == 'pool'``."""
        from gpu.placement import FifoBestFit
        from gpu.scenario import choose

        if self.system != "pool":
            raise ValueError(f"system={self.system!r}: only 'pool' policies place tasks on the runner")
        backfill = choose(self.policy, "policy", {"fifo": False, "fifo-backfill": True})
        return FifoBestFit(backfill=backfill)
