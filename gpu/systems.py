"""Every system gpuflows runs, found rather than listed: ``SYSTEMS[name]`` says where its simulator, controller,
policies, scenario example and flows live, and ``BATCH_POLICIES`` where each serving batch policy lives.

Each package ``gpu/schedulers/<system>/`` declares its own entry, ``SYSTEM = System(...)`` in its ``system.py``
(``gpu.plugin.System``); this module scans ``gpu.schedulers``'s subpackages (``pkgutil``) and imports only those
small modules, so a new system is a new package and edits no shared module. ``gpuflows simulate`` (its choices and
``--help``), the ``SchedulerPolicy`` block (which checks a ``system``/``policy`` pair before a flow starts), the
serving runtime's ``batch_policy`` and the registry-wide invariant tests all read what is found here.
"""

from __future__ import annotations

import importlib
import pkgutil

import gpu.schedulers
from gpu.batching import BatchPolicy
from gpu.errors import ConfigError
from gpu.plugin import ROOT, System, resolve

__all__ = ["BATCH_POLICIES", "ROOT", "SYSTEMS", "System", "make_batch_policy", "resolve", "system"]


def discover() -> dict[str, System]:
    """The ``SYSTEM`` entry of every subpackage of ``gpu.schedulers``, by name (sorted).

    A subpackage without a ``system.py``, or whose entry names another package, is an error here, at import:
    a system that half plugs in would otherwise vanish from the CLI, the block and the registry tests unseen.
    """
    found: dict[str, System] = {}
    for info in pkgutil.iter_modules(gpu.schedulers.__path__, gpu.schedulers.__name__ + "."):
        if not info.ispkg:
            continue
        package = info.name.rpartition(".")[2]
        try:
            entry = importlib.import_module(f"{info.name}.system").SYSTEM
        except (ModuleNotFoundError, AttributeError) as exc:
            raise ImportError(f"{info.name} is a system package without `SYSTEM = System(...)` in its "
                              f"system.py (docs/architecture.md, 'Adding a ninth system'): {exc}") from exc
        if not isinstance(entry, System) or entry.name != package:
            raise ImportError(f"{info.name}.system.SYSTEM must be a gpu.plugin.System named {package!r}, "
                              f"got {entry!r}")
        found[package] = entry
    return dict(sorted(found.items()))


def _batch_policies(systems: dict[str, System]) -> dict[str, str]:
    """Every system's batch policies, name → factory reference; a name two systems declare is an error."""
    refs: dict[str, str] = {}
    owner: dict[str, str] = {}
    for entry in systems.values():
        for name, ref in entry.batch_policies.items():
            if name in refs:
                raise ImportError(f"batch policy {name!r} is declared by both {owner[name]} and {entry.name}")
            refs[name], owner[name] = ref, entry.name
    return refs


SYSTEMS: dict[str, System] = discover()
BATCH_POLICIES: dict[str, str] = _batch_policies(SYSTEMS)
"""Serving batch policies by name (Nexus's ``early_drop``, ``lazy_drop``, ``fixed_batch``; ORLOJ's ``orloj``,
``clockwork``, ``clipper``), each a ``"module:attribute"`` factory declared by its system."""


def system(name: str) -> System:
    """The registered system called ``name``, else ConfigError('system')."""
    if name not in SYSTEMS:
        raise ConfigError("system", name, f"unknown; choose from {sorted(SYSTEMS)}")
    return SYSTEMS[name]


def make_batch_policy(name: str, **params) -> BatchPolicy:
    """A new batch policy by name (ConfigError naming ``batch_policy`` when unknown).

    Each call builds a new instance, so every worker owns its policy's state (ORLOJ's ``orloj`` needs
    ``histograms=``, per-application alone times: ``gpu.schedulers.orloj.policy``).
    """
    if name not in BATCH_POLICIES:
        raise ConfigError("batch_policy", name, f"unknown; choose one of {sorted(BATCH_POLICIES)}")
    return resolve(BATCH_POLICIES[name])(**params)
