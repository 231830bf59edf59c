"""The ESCHER policies flow's input: which policies run and with which settings, every value checked before a
flow run starts (a bad one is one ``ConfigError`` naming the field)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from gpu.errors import ConfigError
from gpu.schedulers.escher.policies import POLICIES
from gpu.scenario import MAX_FACTOR, MAX_SEED, integer, positive
from resource_blocks import SchedulerPolicy


MAX_GANG_TIMEOUT_S = 3_600.0  # AppSpace's wait for a gang's ghosts: an hour
MAX_SIZES = {"jobs": 1_000, "steps": 1_000_000, "shards": 10_000, "words": 10_000_000, "reducers": 1_000,
             "pairs": 1_000, "rounds": 100_000}
"""Each count's bound: the flow runs every task for real (jobs per HFS user, SGD steps, WordCount's shards, words
per shard and reducers, AlphaZero's pairs and rounds)."""


@dataclass(frozen=True)
class Settings:
    """The flow's parameters as the policies read them (a SchedulerPolicy's ``params`` may set any of them)."""

    gang_size: int = 2
    gang_timeout_s: float = 30.0
    team_weights: tuple[float, float] = (1.0, 1.0)
    jobs: int = 2
    steps: int = 30
    seed: int = 0
    shards: int = 8
    words: int = 20000
    reducers: int = 2
    pairs: int = 2
    rounds: int = 20


def policy_block(policy: SchedulerPolicy | str | dict) -> SchedulerPolicy:
    """A ``policy`` parameter as a SchedulerPolicy: the block, a saved block's name, or its fields (API)."""
    if isinstance(policy, SchedulerPolicy):
        return policy
    if isinstance(policy, dict):
        try:
            return SchedulerPolicy(**policy)
        except ValueError as exc:
            raise ConfigError("policy", policy, str(exc).splitlines()[-1]) from exc
    return SchedulerPolicy.load_or_default(policy)


def choose(policies: list[str] | None, policy: SchedulerPolicy | str | dict | None,
           params: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The policies to run, and the flow's parameters with a SchedulerPolicy's ``params`` applied over them.

    ``SchedulerPolicy(system="escher", policy="locality", params={"shards": 4})`` runs WordCount alone on 4
    shards; without a block, ``policies`` names the demos (default: all of ``POLICIES``)."""
    if policy is not None:
        block = policy_block(policy)
        if block.system != "escher":
            raise ConfigError("policy.system", block.system, "this flow runs ESCHER's policies: system='escher'")
        if block.policy not in POLICIES:
            raise ConfigError("policy.policy", block.policy, f"the flow runs {POLICIES}")
        unknown = sorted(set(block.params) - {f.name for f in fields(Settings)})
        if unknown:
            raise ConfigError("policy.params", unknown, f"not a flow parameter; choose from "
                                                         f"{[f.name for f in fields(Settings)]}")
        if policies is not None and list(policies) != [block.policy]:
            raise ConfigError("policies", policies, f"the policy block already chose {block.policy!r}")
        return (block.policy,), {**params, **block.params}
    names = POLICIES if policies is None else policies
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not names:
        raise ConfigError("policies", names, f"give a non-empty list of {POLICIES}")
    for name in names:
        if name not in POLICIES:
            raise ConfigError("policies", name, f"unknown policy; choose from {POLICIES}")
    return tuple(dict.fromkeys(names)), params


def check_settings(params: dict[str, Any], nodes: int) -> Settings:
    """The policies' settings, every value checked (ConfigError naming the field)."""
    integer(params["gang_size"], "gang_size", minimum=1)
    if params["gang_size"] > nodes:
        raise ConfigError("gang_size", params["gang_size"], f"its ghosts are spread one per node; the pool has {nodes}")
    positive(params["gang_timeout_s"], "gang_timeout_s", upper=MAX_GANG_TIMEOUT_S)
    weights = params["team_weights"]
    if not isinstance(weights, (list, tuple)) or len(weights) != 2:
        raise ConfigError("team_weights", weights, "give the two teams' weights, e.g. [1, 1]")
    for i, w in enumerate(weights):
        positive(w, f"team_weights[{i}]", upper=MAX_FACTOR)
    for name, top in MAX_SIZES.items():
        integer(params[name], name, minimum=1, maximum=top)
    if params["pairs"] > nodes:
        raise ConfigError("pairs", params["pairs"], f"predictors are load-balanced one per node; the pool has {nodes}")
    integer(params["seed"], "seed", minimum=0, maximum=MAX_SEED)
    return Settings(**{**{f.name: params[f.name] for f in fields(Settings)}, "team_weights": tuple(weights)})
