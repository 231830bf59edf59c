"""What a system declares to plug into gpuflows: one ``System`` entry of lazy references.

Each system package ``gpu/schedulers/<system>/`` holds a small ``system.py`` with ``SYSTEM = System(...)``;
``gpu.systems`` finds those entries by scanning ``gpu.schedulers`` and builds the registry from them, so a new
system edits no shared module. References are ``"module:attribute"`` strings imported on first use (``resolve``),
so reading the registry imports no engine.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from gpu.errors import ConfigError
from gpu.report import SimulationReport

ROOT = Path(__file__).resolve().parent.parent


def resolve(ref: str) -> Any:
    """Import ``"module:attribute"``."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class System:
    """One system: what ``gpuflows simulate <name>`` runs, which controller its flows drive, what it offers.

    Every system has one layout, so three references follow from its name: the simulator
    ``gpu.sim.<name>.run:run`` (``run(scenario_path, policies) -> SimulationReport``, raising ``ConfigError`` on
    bad input), the policy names ``gpu.schedulers.<name>.policies:POLICIES`` (a name with ``<...>`` is a
    pattern) and the controller's module ``gpu.schedulers.<name>.controller``.

    Args:
        name: the system's name, also its package's (``gpu/schedulers/<name>/``, ``gpu/sim/<name>/``).
        paper: the paper it reproduces, as the docs cite it.
        controller: ``"gpu.schedulers.<name>.controller:<Class>"``, the ``gpu.contract.Controller`` both the
            simulator and the flows drive.
        example: a shipped scenario every default policy runs on, relative to the repository.
        flows: the modules of the Prefect flows that run it (``flows.<name>``; several systems may share one).
        batch_policies: the serving batch policies it defines, name → ``"module:attribute"`` of a factory called
            with the policy's parameters (``gpu.systems.make_batch_policy``).
    """

    name: str
    paper: str
    controller: str
    example: str
    flows: tuple[str, ...] = ()
    batch_policies: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def simulator(self) -> str:
        return f"gpu.sim.{self.name}.run:run"

    @property
    def policies(self) -> str:
        return f"gpu.schedulers.{self.name}.policies:POLICIES"

    @property
    def run(self) -> Callable[[str, list[str] | None], SimulationReport]:
        return resolve(self.simulator)

    def policy_names(self) -> list[str]:
        return list(resolve(self.policies))

    def example_path(self) -> Path:
        return ROOT / self.example

    def check_policy(self, policy: str) -> str:
        """``policy`` when this system offers it (patterns match any filler), else ConfigError('policy')."""
        for name in self.policy_names():
            pattern = re.sub(r"<[^>]+>", ".+", re.escape(name).replace(r"\<", "<").replace(r"\>", ">"))
            if re.fullmatch(pattern, policy):
                return policy
        raise ConfigError("policy", policy, f"not a {self.name} policy; choose from {self.policy_names()}")
