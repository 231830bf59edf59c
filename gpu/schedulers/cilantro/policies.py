"""Cilantro's policies by name (thesis ch. 3, Table 3.2): what the simulator, the allocation-rounds flow and a
``SchedulerPolicy(system="cilantro")`` choose from.

:data:`POLICIES` maps each paper name to a factory; :func:`make_policy` builds a fresh one and raises ConfigError
for an unknown name. A round, as a flow runs it::

    policy = make_policy("cilantro-njc")
    alloc = policy.decide(snapshot, rng)      # {job: amount}; snapshot from learner bounds
    state = policy.get_state()                # JSON; policy.set_state(state) after a restart
"""

from __future__ import annotations

from typing import Callable

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.demand_mmf import DemandMMF
from gpu.schedulers.cilantro.ernest import Ernest
from gpu.schedulers.cilantro.evolutionary import EvoAlgPolicy
from gpu.schedulers.cilantro.fair import ResourceFair
from gpu.schedulers.cilantro.greedy import GreedyEW
from gpu.schedulers.cilantro.minerva import Minerva
from gpu.schedulers.cilantro.quasar import Quasar
from gpu.schedulers.cilantro.reactive import MIAD, Parties
from gpu.schedulers.cilantro.types import AllocationPolicy
from gpu.schedulers.cilantro.welfare import WelfarePolicy

POLICIES: dict[str, Callable[[], AllocationPolicy]] = {
    "oracle-sw": lambda: WelfarePolicy("oracle-sw", "social", learner="oracle"),
    "oracle-ew": lambda: WelfarePolicy("oracle-ew", "egalitarian", learner="oracle"),
    "oracle-njc": lambda: DemandMMF("oracle-njc", learner="oracle"),
    "cilantro-sw": lambda: WelfarePolicy("cilantro-sw", "social"),
    "cilantro-ew": lambda: WelfarePolicy("cilantro-ew", "egalitarian"),
    "cilantro-njc": lambda: DemandMMF("cilantro-njc"),
    "cilantro-pf": lambda: WelfarePolicy("cilantro-pf", "proportional"),
    "evoalg-sw": lambda: EvoAlgPolicy("evoalg-sw", "social"),
    "evoalg-ew": lambda: EvoAlgPolicy("evoalg-ew", "egalitarian"),
    "resource-fair": ResourceFair,
    "greedy-ew": GreedyEW,
    "ernest": Ernest,
    "quasar": Quasar,
    "minerva": Minerva,
    "parties": Parties,
    "miad": MIAD,
}


def make_policy(name: str) -> AllocationPolicy:
    """A fresh policy by its paper name; ConfigError naming ``policy`` if unknown."""
    if name not in POLICIES:
        raise ConfigError("policy", name, f"unknown; choose one of {sorted(POLICIES)}")
    return POLICIES[name]()

