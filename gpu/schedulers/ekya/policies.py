"""Ekya's policy families by name: the thief and the baselines of the paper's evaluation.

Paper: Ekya thesis Chapter 2, Algorithm 1 (thief) and §2.6 "Baselines" / "Component-wise contribution"
(Fig. 2.10a). One name per policy, used by the simulator (``gpuflows simulate ekya --policy``), the
continuous-retraining flow (``policy=``) and ``EkyaController``:

- ``thief``: Algorithm 1 with the scenario's parameters;
- ``thief_start_splits``: the same with ``start_splits`` on (per-stream splits also seed the search; not
  in Algorithm 1);
- ``noretrain``: every stream's ``G/|V|`` serves inference, nobody retrains;
- ``fixedres``: Ekya-FixedRes (uniform 50/50 partition, PickConfigs chooses configs);
- ``uniform_<cfg>_<pct>``: uniform with config ``<cfg>`` and ``<pct>``% (1-100) of each share to inference;
- ``fixedconfig_<cfg>``: Ekya-FixedConfig (the thief, restricted to config ``<cfg>``).

The thief and FixedConfig are re-invoked over the free GPUs when a retraining completes (§2.4); the static
baselines are not (their freed GPUs go to the stream's own inference), which ``EkyaPolicy.reinvoke`` says.

Example::

    >>> make_policy("uniform_cfg1_50", ["cfg1", "cfg2"]).config, policy_names(["cfg1"])[-2:]
    ('cfg1', ('uniform_cfg1_<pct>', 'fixedconfig_cfg1'))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from gpu.errors import ConfigError
from gpu.schedulers.ekya.thief import EkyaDecision, EkyaParams, StreamState, thief_schedule
from gpu.schedulers.ekya.baselines import fixed_config_schedule, fixed_res_schedule, uniform_schedule

Decide = Callable[[Sequence[StreamState], float, float, Mapping[str, float] | None], EkyaDecision]
"""``decide(streams, gpus, window_s, start)``: one invocation of a policy (``start``: re-invocation seed)."""

FIXED_NAMES = ("thief", "thief_start_splits", "noretrain", "fixedres")
POLICIES = FIXED_NAMES + ("uniform_<cfg>_<pct>", "fixedconfig_<cfg>")
"""Every policy name ``make_policy`` accepts (``<cfg>``: a retraining config; ``<pct>``: 1-100): what the system
registry offers (``gpu/schedulers/ekya/system.py``)."""


@dataclass(frozen=True)
class EkyaPolicy:
    """A named Ekya scheduler, whether it is re-invoked when a retraining completes, and its fixed config."""

    name: str
    decide: Decide
    reinvoke: bool  # True: re-run ``decide`` on completion; False: freed GPUs go to the stream's own inference
    config: str | None = None  # the one retraining config the policy may use (None: it chooses among all)
    retrains: bool = True  # False for ``noretrain``

    @property
    def picks_configs(self) -> bool:
        """True when the policy chooses among configs (so pruning the config space matters to it)."""
        return self.retrains and self.config is None


def _config_names(source: Any) -> list[str]:
    """Config names of a scenario (every stream and window) or of an iterable of names/configs."""
    if hasattr(source, "streams"):
        names = (c.name for s in source.streams for w in s.windows for c in w.configs)
    else:
        names = (c if isinstance(c, str) else c.name for c in source)
    return sorted(set(names))


def policy_names(scenario_or_configs: Any) -> tuple[str, ...]:
    """Every policy name valid for a scenario (or a list of config names); ``<pct>`` stands for 1-100."""
    configs = _config_names(scenario_or_configs)
    return FIXED_NAMES + tuple(f"uniform_{c}_<pct>" for c in configs) + tuple(f"fixedconfig_{c}" for c in configs)


def make_policy(name: str, scenario_or_configs: Any, params: EkyaParams | None = None) -> EkyaPolicy:
    """The policy called ``name`` (see module docstring); an unknown name raises ConfigError('policy').

    Args:
        name: policy name.
        scenario_or_configs: an ``EkyaScenario`` (its params are the default ``params``) or config names.
        params: thief knobs (default: the scenario's, else ``EkyaParams()``).
    """
    configs = _config_names(scenario_or_configs)
    p = params or getattr(scenario_or_configs, "params", None) or EkyaParams()
    if not isinstance(name, str):
        raise ConfigError("policy", name, "must be a policy name")
    if name in ("thief", "thief_start_splits"):
        q = replace(p, start_splits=True) if name == "thief_start_splits" else p
        return EkyaPolicy(name, lambda s, g, w, start=None: thief_schedule(s, g, w, q, start), True)
    if name == "noretrain":
        return EkyaPolicy(name, lambda s, g, w, start=None: uniform_schedule(s, g, w, "", 1.0, p), False,
                          retrains=False)
    if name == "fixedres":
        return EkyaPolicy(name, lambda s, g, w, start=None: fixed_res_schedule(s, g, w, p), False)
    m = re.fullmatch(r"uniform_(.+)_(\d+)", name)
    if m and m.group(1) in configs and 0 < int(m.group(2)) <= 100:
        cfg, share = m.group(1), int(m.group(2)) / 100
        return EkyaPolicy(name, lambda s, g, w, start=None: uniform_schedule(s, g, w, cfg, share, p), False, cfg)
    m = re.fullmatch(r"fixedconfig_(.+)", name)
    if m and m.group(1) in configs:
        cfg = m.group(1)
        return EkyaPolicy(name, lambda s, g, w, start=None: fixed_config_schedule(s, g, w, cfg, p, start), True, cfg)
    raise ConfigError("policy", name, "unknown; choose thief, thief_start_splits, noretrain, fixedres, "
                                      f"uniform_<cfg>_<1-100> or fixedconfig_<cfg> with <cfg> in {configs}")


def check_policies(names: Iterable[str], scenario_or_configs: Any) -> None:
    """Raise ConfigError('policy') for the first unknown name, before any work starts."""
    for name in names:
        make_policy(name, scenario_or_configs)
