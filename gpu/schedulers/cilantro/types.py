"""The snapshot a Cilantro policy decides from, and the policy contract (thesis ch. 3, §3.3 Fig. 3.3).

Learners and forecasters live outside the policy: each round the caller (simulator or Prefect
flow) asks them for performance bounds on the allocation grid at the load UCB and hands the
policy a frozen :class:`Snapshot`. A policy returns ``{job: amount}``; it never touches a pool.
Policies that keep history across rounds (demand recommendations, evolutionary archives,
reactive demands) expose it through ``get_state()``/``set_state()`` as plain JSON values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.metrics import utility, utility_exponent

Allocation = dict[str, float]


@dataclass(frozen=True)
class JobSpec:
    """One tenant: its SLO on the raw performance metric and how SLO misses turn into utility."""

    name: str
    slo: float | None
    utility: str = "linear"
    weight: float = 1.0
    workload: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("job.name", self.name, "must be a non-empty string")
        if self.slo is not None and not (isinstance(self.slo, (int, float)) and self.slo > 0):
            raise ConfigError(f"{self.name}.slo", self.slo, "must be a number > 0")
        utility_exponent(self.utility)
        if not self.weight > 0:
            raise ConfigError(f"{self.name}.weight", self.weight, "must be > 0")

    @property
    def exponent(self) -> float:
        return utility_exponent(self.utility)

    def utility_of(self, perf: np.ndarray | float) -> np.ndarray:
        """Utility of a performance value; ConfigError if the job declares no SLO."""
        if self.slo is None:
            raise ConfigError(f"{self.name}.slo", None, "this policy needs an SLO for every job")
        return utility(perf, self.slo, self.exponent)


@dataclass(frozen=True)
class Feedback:
    """What a job reported over the last round: its allocation, mean load and mean performance."""

    alloc: float
    load: float
    perf: float


@dataclass(frozen=True, eq=False)
class JobView:
    """A job as a policy sees it in one round.

    ``perf_lcb``/``perf_ucb`` are performance bounds at ``alloc_grid`` (the feasible amounts,
    multiples of the unit) under the load UCB; for an oracle both equal the true curve.
    ``demand_cap`` is the largest allocation the job can use (its learner's interval end times
    the load UCB): the demand of a job whose SLO is out of reach.
    """

    spec: JobSpec
    alloc_grid: np.ndarray
    perf_lcb: np.ndarray
    perf_ucb: np.ndarray
    load_ucb: float = 1.0
    feedback: Feedback | None = None
    stated_demand: float | None = None
    demand_cap: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def utility_ucb(self) -> np.ndarray:
        return self.spec.utility_of(self.perf_ucb)

    def utility_lcb(self) -> np.ndarray:
        return self.spec.utility_of(self.perf_lcb)


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Everything one allocation round decides from.

    Args:
        capacity: ``R``, the pool size (>= 0).
        jobs: the jobs, in a fixed order.
        unit: allocation granularity (1 = whole CPUs; < 1 = fractional shares).
        previous: last round's allocation (None in round 0).
        max_change: ``B``, the largest per-job change between rounds (None = unbounded).
        round_index: 0 for the first round.
    """

    capacity: float
    jobs: tuple[JobView, ...]
    unit: float = 1.0
    previous: Mapping[str, float] | None = None
    max_change: float | None = 10.0
    round_index: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.capacity, (int, float)) and math.isfinite(self.capacity) and self.capacity >= 0):
            raise ConfigError("capacity", self.capacity, "must be a finite number >= 0")
        if not self.unit > 0:
            raise ConfigError("unit", self.unit, "must be > 0")
        if self.max_change is not None and not self.max_change >= 0:
            raise ConfigError("max_change", self.max_change, "must be >= 0 or None")
        if not self.jobs:
            raise ConfigError("jobs", [], "at least one job is needed")
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ConfigError("jobs", names, "job names must be unique")

    @property
    def n(self) -> int:
        return len(self.jobs)

    @property
    def units(self) -> int:
        """Capacity in whole units of ``unit``."""
        return int(math.floor(self.capacity / self.unit + 1e-9))

    def previous_units(self) -> np.ndarray | None:
        if self.previous is None:
            return None
        return np.array([round(self.previous.get(j.name, 0.0) / self.unit) for j in self.jobs], dtype=int)


class AllocationPolicy:
    """Base of every allocation policy: ``decide`` plus JSON state for resuming after a crash.

    ``learner`` tells the caller which bounds to put in the snapshot: ``"online"`` (learned
    UCB/LCB), ``"oracle"`` (the true curves) or ``"none"`` (the policy uses only feedback).
    """

    name: str = "policy"
    learner: str = "none"

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: Mapping[str, Any]) -> None:
        return None


def as_allocation(snapshot: Snapshot, units: np.ndarray) -> Allocation:
    """Turn a vector of units (snapshot job order) into ``{job: amount}``."""
    return {j.name: float(u) * snapshot.unit for j, u in zip(snapshot.jobs, units)}
