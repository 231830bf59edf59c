"""Scheduler-policy settings that flows read; the policy logic lives in ``gpu/``.

The block is checked against the system registry (``gpu.systems.SYSTEMS``) when it is created or
loaded, so a misspelt system or policy fails when it is saved, not in the middle of a scheduled run.
"""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from pydantic import Field, model_validator

from resource_blocks._defaults import load_or_default


class SchedulerPolicy(Block):
    """A named policy of one system plus its parameters, e.g. ``system='ekya', policy='thief',
    params={'delta': 0.1}``. The placement policy of the task runner is ``system='pool'``
    (``fifo`` or ``fifo-backfill``); a flow reads the other systems' blocks itself, e.g.
    ``system='escher', policy='locality', params={'shards': 4}`` runs the ESCHER flow's WordCount alone
    (``tasks.escher.settings.choose``; the names are ``gpu.schedulers.escher.policies.POLICIES``)."""

    _block_type_name = "gpuflows scheduler policy"
    _description = "Which scheduler policy a gpuflows flow uses, with its parameters."

    system: str = Field(default="pool", description="System the policy belongs to: 'pool' (the task runner's "
                                                    "placement) or one of `gpuflows simulate --help`'s systems.")
    policy: str = Field(default="fifo", description="Policy name within the system.")
    params: dict[str, Any] = Field(default_factory=dict, description="Policy parameters.")

    @model_validator(mode="after")
    def _known_policy(self) -> "SchedulerPolicy":
        from gpu.scenario import choose
        from gpu.systems import system

        if self.system == "pool":
            choose(self.policy, "policy", ["fifo", "fifo-backfill"])
        else:
            system(self.system).check_policy(self.policy)
        if not all(isinstance(k, str) for k in self.params):
            raise ValueError(f"params: keys must be parameter names, got {list(self.params)[:5]!r}")
        return self

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
