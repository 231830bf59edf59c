"""Soft constraints, OR-composition and conflict relaxation as an ESL (ESCHER §4.4g–h, Fig. 4.4a).

A task carries an ordered list of resource requirements ``[r1, ..., rn]``; the ESL launches it with
r1 and, when no heartbeat arrives within ``timeout``, cancels it and relaunches with the next, until
one runs or the list is exhausted (then the task is reported unschedulable: the paper's loop just
ends). The same list is OR-composition: ``[{fair_a: 1, anti: 1}, {fair_a: 1}]`` tries fairness
and anti-affinity, and relaxes anti-affinity on conflict.

* ``SoftConstraint``: Fig. 4.4a as a state machine for a world with a clock (the simulator, a flow).
* ``allocate_preferred``: the same loop on a ledger, each attempt a timed ``allocate`` (the grant is
  the heartbeat).
* ``objective_preferences``: §4.4g's objective-function policy, maximise min over nodes of
  α·M + β·C, as preferences ``[{obj: γ}, {obj: γ/2}, ..., {obj: γ/2^k}]`` on a per-node ``obj``
  resource of capacity α+β. Memory and CPU shares are fractions of a node (the capacity α+β
  only makes sense normalised); the placement is correct to a factor of 2, as the paper states.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from gpu.errors import AllocationTimeout, ConfigError
from gpu.placement import ResourceRequest
from gpu.schedulers.escher.api import Escher, NodeSpec
from gpu.scenario import integer, positive

OBJECTIVE = "obj"


def _checked(preferences: Sequence[Mapping[str, float]]) -> tuple[dict[str, float], ...]:
    if isinstance(preferences, (str, bytes, Mapping)) or not preferences:
        raise ConfigError("preferences", preferences, "must be a non-empty list of resource requirements")
    return tuple(dict(p) for p in preferences)


@dataclass(frozen=True)
class Attempt:
    """Launch the task with preference ``index`` (cancelling any earlier attempt); wake at ``wake_at``.
    ``index`` None: every preference failed, the task is unschedulable."""

    index: int | None
    resources: Mapping[str, float]
    wake_at: float | None


@dataclass
class SoftConstraint:
    """Fig. 4.4a for one task: next preference on each heartbeat timeout."""

    preferences: Sequence[Mapping[str, float]]
    timeout: float = 5.0
    system: str = "escher"
    policy: str = "soft"
    hooks: tuple[str, ...] = ("on_arrival",)

    def __post_init__(self) -> None:
        self.preferences = _checked(self.preferences)
        positive(self.timeout, "timeout")
        self._index = -1
        self.running = False

    def on_arrival(self, now: float) -> Attempt:
        return self._next(now)

    def on_heartbeat(self, now: float) -> None:
        """The current attempt runs: the loop ends."""
        self.running = True

    def on_timer(self, now: float) -> Attempt | None:
        """No heartbeat by the deadline: cancel and relaunch with the next preference (None once running)."""
        return None if self.running else self._next(now)

    def _next(self, now: float) -> Attempt:
        self._index += 1
        if self._index >= len(self.preferences):
            return Attempt(None, {}, None)
        return Attempt(self._index, self.preferences[self._index], now + self.timeout)


def allocate_preferred(ledger, request: ResourceRequest, preferences: Sequence[Mapping[str, float]],
                       timeout: float) -> tuple[int, object]:
    """Fig. 4.4a on a ledger: ``request`` with each preference's resources added, ``timeout`` s each;
    returns (preference index, placement); AllocationTimeout when none was granted."""
    preferences = _checked(preferences)
    positive(timeout, "timeout")
    for i, pref in enumerate(preferences):
        try:
            return i, ledger.allocate(replace(request, resources={**request.resources, **pref}), timeout=timeout)
        except AllocationTimeout:
            continue
    raise AllocationTimeout(f"request {request.describe()} fits none of its {len(preferences)} preferences")


def setup_objective(esl: Escher, alpha: float, beta: float) -> None:
    """Create ``obj`` with capacity α+β on every node."""
    esl.set_resource(OBJECTIVE, positive(alpha, "alpha") + positive(beta, "beta"), NodeSpec())


def objective_preferences(memory: float, cpu: float, alpha: float, beta: float, k: int = 4) -> list[dict[str, float]]:
    """``[{obj: γ}, {obj: γ/2}, ..., {obj: γ/2^k}]`` with γ = α·memory + β·cpu (fractions of a node)."""
    for name, v in (("memory", memory), ("cpu", cpu)):
        if not 0 <= positive(v, name, allow_zero=True) <= 1:
            raise ConfigError(name, v, "must be a fraction of a node in [0, 1]")
    gamma = alpha * memory + beta * cpu
    if gamma <= 0:
        raise ConfigError("memory, cpu", (memory, cpu), "a task using neither has no objective to place by")
    return [{OBJECTIVE: gamma / 2 ** j} for j in range(integer(k, "k", minimum=0) + 1)]
