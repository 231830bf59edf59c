"""Every system gpuflows runs, in one registry: ``SYSTEMS[name]`` says where its simulator, controller,
policies, scenario example and flow live.

``gpuflows simulate`` (its choices and ``--help``), the ``SchedulerPolicy`` block (which checks a
``system``/``policy`` pair before a flow starts) and the registry-wide invariant tests all read this
table, so a new system plugs in with one entry. References are ``"module:attribute"`` strings imported
on first use, so the CLI starts without importing every engine.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpu.errors import ConfigError
from gpu.report import SimulationReport

ROOT = Path(__file__).resolve().parent.parent


def resolve(ref: str) -> Any:
    """Import ``"module:attribute"``."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class System:
    """One system: what ``gpuflows simulate <name>`` runs and which controller its flow drives.

    ``simulator``: ``run(scenario_path, policies) -> SimulationReport``, raising ``ConfigError`` on bad
    input. ``controller``: the ``gpu.contract.Controller`` class both the simulator and the flow drive.
    ``policies``: references to collections of policy names (a name with ``<...>`` is a pattern).
    ``example``: a shipped scenario every policy runs on. ``flow``: the module of its Prefect flow.
    """

    name: str
    paper: str
    simulator: str
    controller: str
    policies: tuple[str, ...]
    example: str
    flow: str | None = None

    @property
    def run(self) -> Callable[[str, list[str] | None], SimulationReport]:
        return resolve(self.simulator)

    def policy_names(self) -> list[str]:
        names: list[str] = []
        for ref in self.policies:
            names += [n for n in resolve(ref) if n not in names]
        return names

    def example_path(self) -> Path:
        return ROOT / self.example

    def check_policy(self, policy: str) -> str:
        """``policy`` when this system offers it (patterns match any filler), else ConfigError('policy')."""
        import re

        for name in self.policy_names():
            pattern = re.sub(r"<[^>]+>", ".+", re.escape(name).replace(r"\<", "<").replace(r"\>", ">"))
            if re.fullmatch(pattern, policy):
                return policy
        raise ConfigError("policy", policy, f"not a {self.name} policy; choose from {self.policy_names()}")


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("ekya", "Bhardwaj et al., Ekya, NSDI 2022", "gpu.sim.ekya.run:run",
           "gpu.schedulers.ekya.controller:EkyaController", ("gpu.schedulers.ekya.policies:POLICY_FORMS",),
           "scenarios/ekya/table_2_1.yaml", "flows.continuous_retraining"),
    System("fluid", "Yu, FLUID (Salus/FLUID thesis, ch. 3)", "gpu.sim.fluid.run:run",
           "gpu.schedulers.fluid.executor:FluidExecutor", ("gpu.schedulers.fluid.policies:POLICIES",),
           "scenarios/fluid/toy.yaml", "flows.trial_groups"),
    System("cilantro", "Bhardwaj et al., Cilantro, OSDI 2023", "gpu.sim.cilantro.run:run",
           "gpu.schedulers.cilantro.round:CilantroRound",
           ("gpu.schedulers.cilantro:POLICIES", "gpu.sim.cilantro.scenario:STATIC_POLICIES"),
           "scenarios/cilantro/small.yaml", "flows.allocation_rounds"),
    System("nexus", "Shen et al., Nexus, SOSP 2019", "gpu.sim.nexus.run:run",
           "gpu.schedulers.nexus.controller:NexusController", ("gpu.schedulers.nexus.strategies:STRATEGIES",),
           "scenarios/nexus/table2_toy.yaml", "flows.serving_rollout"),
    System("salus", "Yu, Salus (Salus/FLUID thesis, ch. 2; MLSys 2020)", "gpu.sim.salus.run:run",
           "gpu.schedulers.salus.controller:SalusController", ("gpu.schedulers.salus.policies:POLICIES",),
           "scenarios/salus/fair_three_jobs.yaml", "flows.gpu_sharing"),
    System("escher", "Bhardwaj, ESCHER: Expressive Scheduling with Ephemeral Resources, SoCC 2021 (thesis ch. 4)",
           "gpu.sim.escher.run:run", "gpu.schedulers.escher.hfs:HierarchicalFairShare", ("gpu.sim.escher.run:POLICIES",),
           "scenarios/escher/small.yaml", "flows.escher_policies"),
    System("orloj", "Yu, ORLOJ (PhD thesis, U. Michigan 2022, ch. 4)", "gpu.sim.orloj.run:run",
           "gpu.schedulers.orloj.controller:OrlojController", ("gpu.sim.orloj.workload:POLICY_NAMES",),
           "scenarios/orloj/small.yaml"),
    System("nona", "Pit-Claudel et al., Nona: congestion-aware stochastic scheduling of inference queries",
           "gpu.sim.nona.run:run", "gpu.schedulers.nona.policy:NonaController", ("gpu.sim.nona.run:POLICIES",),
           "scenarios/nona/motivating.yaml"),
)}


def system(name: str) -> System:
    """The registered system called ``name``, else ConfigError('system')."""
    if name not in SYSTEMS:
        raise ConfigError("system", name, f"unknown; choose from {sorted(SYSTEMS)}")
    return SYSTEMS[name]
