"""The serving configurations ``gpuflows simulate nexus --policy`` and the Nexus controller choose between.

A *policy* here is a whole serving configuration from the paper's evaluation (Nexus §7): a placement
(squishy bin packing, §6.1 Algorithm 1; batch-oblivious; no co-location), a dispatch batch policy (early drop,
§6.3; lazy drop; fixed batch), a query split (§6.2 DP or even), prefix batching (§6.4, on or off), CPU
pre-processing overlapped with the GPU (OL, §6.3, on or off) and the frontend's load balancer (§5). ``nexus`` is
the full system; the others are its ablations and the Clipper/TF-Serving-like baselines of §7.2.

Example: ``POLICIES["batch_oblivious"]`` → ``Strategy("batch_oblivious", "batch_oblivious", "early_drop", "even")``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu.errors import ConfigError


@dataclass(frozen=True)
class Strategy:
    """One serving configuration: placement × dispatch batch policy × query split × PB × OL."""

    name: str
    placement: str
    batch_policy: str
    query_split: str = "dp"
    prefix_batching: bool = True
    overlap: bool = True  # OL: CPU pre-processing overlapped with the GPU (module docstring)
    # How requests are spread over a session's GPUs (``nexus_routing.balancer``). Nexus and its ablations run on
    # Nexus's frontend: DRR, as the runtime and the authors' ``GetBackendDeficitRoundRobin``. The §7.2
    # baselines do not: "We rely on Clipper's load balancer to manage model replicas. In contrast, TF does not
    # provide a frontend load balancer [...] We, therefore, provide a dispatcher" — neither is Nexus's DRR, so
    # they route each request independently in proportion to the replicas' shares (weighted random).
    load_balancer: str = "drr"


POLICIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("nexus", "squishy", "early_drop"),
    Strategy("nexus_lazy_drop", "squishy", "lazy_drop"),
    Strategy("nexus_even_split", "squishy", "early_drop", "even"),
    Strategy("nexus_no_prefix_batching", "squishy", "early_drop", "dp", False),
    Strategy("no_colocation", "no_colocation", "early_drop"),
    Strategy("batch_oblivious", "batch_oblivious", "early_drop", "even"),
    Strategy("batch_oblivious_no_prefix_batching", "batch_oblivious", "early_drop", "even", False),
    Strategy("batch_oblivious_lazy_drop_overlap", "batch_oblivious", "lazy_drop", "even", False),
    # §7.2 baselines: the real Clipper / TF Serving pre-process without OL (the paper's conjecture, §7.3.1)
    # and route with their own balancer, not Nexus's frontend (``Strategy.load_balancer``)
    Strategy("batch_oblivious_lazy_drop", "batch_oblivious", "lazy_drop", "even", False, False, "weighted_random"),
    Strategy("batch_oblivious_fixed_batch", "batch_oblivious", "fixed_batch", "even", False, False,
             "weighted_random"),
)}


def policy_names() -> list[str]:
    """Every Nexus policy, the full system first (what the system registry offers)."""
    return list(POLICIES)


def strategy(name: str) -> Strategy:
    """The serving configuration called ``name``."""
    if name not in POLICIES:
        raise ConfigError("policy", name, f"unknown Nexus policy; choose one of {policy_names()}")
    return POLICIES[name]
