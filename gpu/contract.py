"""The scheduler contract every system follows: one controller, two worlds.

A *world* owns the clock and the work: the discrete-event simulator (``gpu.sim.events.EventLoop``,
outcomes from a model) or a Prefect flow (wall clock, outcomes measured from torch work on a pool
slice). A *controller* owns the decisions. The world calls the controller's hooks when something
happens, passing its clock's ``now`` and what it observed; each hook returns a frozen decision that the
world applies (launch, resize, stop, re-route). Controllers never read a clock, sleep or do I/O, so
the same object runs under both worlds — SimPy's "swap the clock" idea, and the shape FLUID's
executor had from the start (it returns ``Step``s).

Two Protocols:

- ``DecisionPolicy``: a pure rule, snapshot → decision (Ekya's thief, a Cilantro policy, a batch
  policy). Same snapshot, same decision.
- ``Controller``: the event-driven loop around a policy. Hooks come from one vocabulary
  (``HOOKS``); a controller lists the ones it answers in ``hooks``. Every hook takes ``now`` (seconds
  on the world's clock) first and returns a frozen dataclass.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Protocol, TypeVar, runtime_checkable

S = TypeVar("S", contravariant=True)
D = TypeVar("D", covariant=True)

HOOKS: dict[str, str] = {
    "on_window_start": "a retraining window begins (Ekya §2.4)",
    "on_job_done": "a job the controller launched finished; the observation carries what it measured",
    "on_round": "an allocation round ends with each job's measured feedback (Cilantro §3.4)",
    "on_epoch": "a serving epoch ends with measured request rates (Nexus §6.3)",
    "on_group": "a new group of trials arrives (FLUID §3.3.3)",
    "on_trial_done": "a trial finished (FLUID §3.3.3)",
    "on_arrival": "a job or query arrives",
    "on_iteration": "a job reached an iteration boundary",
    "on_wake": "a wake-up time the controller asked for has come (a batch policy waiting to fill a batch)",
}
"""The hook vocabulary every system shares. A new kind of event is a change to the contract, not to one system: its
hook goes here, with the event that triggers it."""


@runtime_checkable
class DecisionPolicy(Protocol[S, D]):
    """A pure decision rule: ``decide(snapshot)`` → frozen decision, no clock and no side effects."""

    name: str

    def decide(self, snapshot: S) -> D: ...


@runtime_checkable
class Controller(Protocol):
    """One system's decision loop, driven by a world's clock (see module docstring)."""

    system: str
    policy: str
    hooks: tuple[str, ...]


def is_frozen_decision(value: Any) -> bool:
    """True for a frozen dataclass instance: what every hook and policy must return."""
    return (dataclasses.is_dataclass(value) and not isinstance(value, type)
            and bool(value.__dataclass_params__.frozen))


def contract_violations(controller: Any) -> list[str]:
    """What makes ``controller`` break the contract (empty when it follows it).

    Checked: it is a ``Controller``; each listed hook is in ``HOOKS`` and is a method whose first
    parameter is ``now``. A class is checked the same way when it declares ``system`` and ``hooks``
    as class attributes (the registry checks controllers without building one).
    """
    is_class = isinstance(controller, type)
    if is_class:
        missing = [a for a in ("system", "hooks") if not hasattr(controller, a)]
        if missing:
            return [f"{controller.__name__} lacks class attributes {missing}"]
    elif not isinstance(controller, Controller):
        return [f"{type(controller).__name__} lacks system/policy/hooks"]
    problems = []
    for hook in controller.hooks:
        if hook not in HOOKS:
            problems.append(f"hook {hook!r} is not in gpu.contract.HOOKS")
            continue
        method = getattr(controller, hook, None)
        if not callable(method):
            problems.append(f"hook {hook!r} is listed but not a method")
            continue
        params = list(inspect.signature(method).parameters)[1 if is_class else 0:]
        if not params or params[0] != "now":
            problems.append(f"hook {hook!r} must take `now` first, takes {params[:3]}")
    return problems
