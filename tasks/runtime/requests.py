"""Declaring a task's GPU request, overriding it per call, and reading the placement inside a task.

    @gpu_request(gpus=0.5, memory="2GiB")
    @task
    def train(...):
        p = current_placement()          # device string, fraction, memory cap
        model.to(p.device)

    with gpu_options(gpus=1):            # per-call override, like prefect_ray's remote_options
        train.submit(...)

    with gpu_options(gpus=1, prefer=[{"node": "node0"}, {}]):   # soft constraint: node0 if it can be had
        train.submit(...)

``prefer`` is ESCHER's soft constraint (thesis §4.4g, Fig. 4.4a): requests in preference order, each
the task's request with that entry's fields replaced (``resources`` are added to the task's own, the
AND-composition of §4.4h). The runner tries each for its share of the allocation timeout and falls back
down the list (OR-composition / conflict relaxation: ``[{"resources": {"anti-x": 1}}, {}]``).

The request is stored on the task's function, so ``task.with_options(...)`` keeps it.
"""

from __future__ import annotations

import contextvars
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from gpu.errors import ConfigError
from gpu.ledger import Lease
from gpu.placement import ResourceRequest

_ATTR = "__gpuflows_request__"
_PREFERENCE_FIELDS = ("gpus", "memory", "cpus", "resources", "node", "devices")
_OVERRIDES: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("gpuflows_overrides", default={})
_PLACEMENT: contextvars.ContextVar["TaskPlacement | None"] = contextvars.ContextVar("gpuflows_placement", default=None)
PLACEMENT_ENV = "GPUFLOWS_PLACEMENT"


def gpu_request(gpus: float = 0.0, memory: int | str = 0, cpus: float = 0.0,
                resources: Mapping[str, float] | None = None, node: str | None = None,
                devices: Sequence[int] | None = None, prefer: Sequence[Mapping[str, Any]] | None = None):
    """Decorator that declares what a task needs from the pool (works above or below ``@task``);
    ``prefer``: soft constraints, requests in preference order (see the module docstring)."""
    spec = dict(gpus=gpus, memory=memory, cpus=cpus, resources=dict(resources or {}), node=node,
                devices=None if devices is None else tuple(devices))
    ResourceRequest(**spec)  # validate now, at import time, with a clear error
    if prefer is not None:
        preferences(spec, prefer)
        spec["prefer"] = [dict(entry) for entry in prefer]

    def wrap(obj):
        fn = getattr(obj, "fn", obj)
        setattr(fn, _ATTR, spec)
        return obj

    return wrap


@contextmanager
def gpu_options(**overrides: Any) -> Iterator[None]:
    """Override the request of every task submitted inside this block (nested blocks merge; an inner
    ``prefer`` replaces an outer one)."""
    base = {k: v for k, v in overrides.items() if k not in ("label", "prefer")}
    ResourceRequest(**base)
    if overrides.get("prefer") is not None:
        preferences(base, overrides["prefer"])
    token = _OVERRIDES.set({**_OVERRIDES.get(), **overrides})
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def preferences(base: Mapping[str, Any], prefer: Sequence[Mapping[str, Any]]) -> tuple[ResourceRequest, ...]:
    """``base`` (request fields) refined by each entry of ``prefer``, in order: an entry's fields replace
    the base's, its ``resources`` are added to the base's. ConfigError('prefer') for an empty list or an
    entry that is not a mapping of request fields."""
    if isinstance(prefer, (str, bytes, Mapping)) or not isinstance(prefer, Sequence) or not prefer:
        raise ConfigError("prefer", prefer, "must be a non-empty list of request fields, most preferred first")
    out = []
    for i, entry in enumerate(prefer):
        unknown = sorted(set(entry) - set(_PREFERENCE_FIELDS)) if isinstance(entry, Mapping) else None
        if unknown is None or unknown:
            raise ConfigError(f"prefer[{i}]", entry, f"must map request fields {_PREFERENCE_FIELDS} to values")
        resources = {**dict(base.get("resources") or {}), **dict(entry.get("resources") or {})}
        out.append(ResourceRequest(**{**base, **entry, "resources": resources}))
    return tuple(out)


def resolve_requests(task: Any, default: Mapping[str, Any] | None = None) -> tuple[ResourceRequest, ...]:
    """The requests for one submission, most preferred first (one unless ``prefer`` was given):
    runner default < task declaration < gpu_options block."""
    spec: dict[str, Any] = dict(default or {})
    spec.update(getattr(getattr(task, "fn", task), _ATTR, {}))
    spec.update(_OVERRIDES.get())
    spec.setdefault("label", getattr(task, "name", ""))
    prefer = spec.pop("prefer", None)
    return (ResourceRequest(**spec),) if prefer is None else preferences(spec, prefer)


def resolve_request(task: Any, default: Mapping[str, Any] | None = None) -> ResourceRequest:
    """The most preferred request for one submission (see ``resolve_requests``)."""
    return resolve_requests(task, default)[0]


@dataclass(frozen=True)
class TaskPlacement:
    """What a running task was given: where to put tensors and how much it may use."""

    placement: Lease
    device: str                 # torch device string: 'cuda:N' on real GPUs, 'cpu' on a simulated pool
    visible_devices: str        # CUDA_VISIBLE_DEVICES the task runs under ('' in thread mode)
    admission: dict[str, Any] | None = None
    """What the runner's admission (``tasks.runtime.admission``) gave the task, opaque here and read by the
    admitting system's own helper; None for a plain lease."""

    @property
    def fraction(self) -> float:
        return self.placement.fraction

    @property
    def memory_cap(self) -> int:
        """Bytes of GPU memory the task may use per device (0: no cap requested): its admission's budget where
        that set one (``memory_cap`` of the payload), else its lease's memory."""
        return int((self.admission or {}).get("memory_cap", self.placement.memory))

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.placement.devices

    def to_env(self) -> str:
        return json.dumps({"placement": self.placement.to_dict(), "device": self.device,
                           "visible_devices": self.visible_devices, "admission": self.admission})

    @classmethod
    def from_env(cls, text: str) -> "TaskPlacement":
        d = json.loads(text)
        return cls(Lease.from_dict(d["placement"]), d["device"], d["visible_devices"], d.get("admission"))


def current_placement() -> TaskPlacement | None:
    """The placement of the task running now (None outside a GPU task runner)."""
    p = _PLACEMENT.get()
    if p is None and os.environ.get(PLACEMENT_ENV):
        p = TaskPlacement.from_env(os.environ[PLACEMENT_ENV])
    return p


@contextmanager
def placed(placement: TaskPlacement | None) -> Iterator[None]:
    """Make ``placement`` what ``current_placement()`` returns in this context (thread mode)."""
    token = _PLACEMENT.set(placement)
    try:
        yield
    finally:
        _PLACEMENT.reset(token)
