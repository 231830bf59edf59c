"""The execution policies FLUID is evaluated against (thesis §3.6.1), by name, for the simulator and the flow.

* ``fifo`` — one whole GPU per trial, FIFO queue (Ray Tune's default execution; ``FifoExecutor``);
* ``static_fluid`` — Algorithm 3.1 only (``FluidExecutor(dynamic=False)``);
* ``fluid`` — Algorithms 3.1 + 3.2, FLUID as evaluated (``FluidExecutor``).

Each is a ``gpu.contract.Controller`` of system ``"fluid"`` with the hooks ``on_group`` and ``on_trial_done``.
"""

from __future__ import annotations

from typing import Sequence

from gpu.scenario import choose
from gpu.schedulers.fluid.algorithms import FluidParams
from gpu.schedulers.fluid.baselines import FifoExecutor
from gpu.schedulers.fluid.controller import FluidExecutor

POLICIES = ("fifo", "static_fluid", "fluid")


def policy_names() -> tuple[str, ...]:
    """Every FLUID execution policy, baseline first (what ``gpuflows simulate fluid --policy`` and the flow accept)."""
    return POLICIES


def build_executor(policy: str, gpus: int | Sequence[int], params: FluidParams,
                   concurrency: int | None = None) -> FluidExecutor | FifoExecutor:
    """The controller behind a policy name on ``gpus`` (a count: GPUs 0..n-1; or the pool's device ids)."""
    choose(policy, "policy", list(POLICIES))
    ids = list(range(gpus)) if isinstance(gpus, int) else list(gpus)
    if policy == "fifo":
        return FifoExecutor(ids)
    return FluidExecutor(ids, params, dynamic=policy == "fluid", concurrency=concurrency)
