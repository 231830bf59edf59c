"""Declaring a task's GPU request, overriding it per call, and reading the placement inside a task.

    @gpu_request(gpus=0.5, memory="2GiB")
    @task
    def train(...):
        p = current_placement()          # device string, fraction, memory cap
        model.to(p.device)

    with gpu_options(gpus=1):            # per-call override, like prefect_ray's remote_options
        train.submit(...)

The request is stored on the task's function, so ``task.with_options(...)`` keeps it.
"""

from __future__ import annotations

import contextvars
import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Mapping, Sequence

from gpu.ledger import Placement
from gpu.placement import Request

_ATTR = "__gpuflows_request__"
_OVERRIDES: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("gpuflows_overrides", default={})
_PLACEMENT: contextvars.ContextVar["TaskPlacement | None"] = contextvars.ContextVar("gpuflows_placement", default=None)
PLACEMENT_ENV = "GPUFLOWS_PLACEMENT"


def gpu_request(gpus: float = 0.0, memory: int | str = 0, cpus: float = 0.0,
                resources: Mapping[str, float] | None = None, node: str | None = None,
                devices: Sequence[int] | None = None):
    """Decorator that declares what a task needs from the pool (works above or below ``@task``)."""
    spec = dict(gpus=gpus, memory=memory, cpus=cpus, resources=dict(resources or {}), node=node,
                devices=None if devices is None else tuple(devices))
    Request(**spec)  # validate now, at import time, with a clear error

    def wrap(obj):
        fn = getattr(obj, "fn", obj)
        setattr(fn, _ATTR, spec)
        return obj

    return wrap


@contextmanager
def gpu_options(**overrides: Any) -> Iterator[None]:
    """Override the request of every task submitted inside this block (nested blocks merge)."""
    Request(**{k: v for k, v in overrides.items() if k != "label"})
    token = _OVERRIDES.set({**_OVERRIDES.get(), **overrides})
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def resolve_request(task: Any, default: Mapping[str, Any] | None = None) -> Request:
    """The request for one submission: runner default < task declaration < gpu_options block."""
    spec: dict[str, Any] = dict(default or {})
    spec.update(getattr(getattr(task, "fn", task), _ATTR, {}))
    spec.update(_OVERRIDES.get())
    spec.setdefault("label", getattr(task, "name", ""))
    return Request(**spec)


@dataclass(frozen=True)
class Lane:
    """The Salus memory lane a task was admitted into (thesis Alg. 2.1; ``tasks.salus_executor``).

    ``memory_cap``: bytes the job may use, its persistent memory plus the lane's size (``P + L_lane``);
    ``token``: address of the device executor's iteration-token service (a Unix socket path).
    """

    lane_id: int
    job_id: str
    memory_cap: int
    token: str


@dataclass(frozen=True)
class TaskPlacement:
    """What a running task was given: where to put tensors and how much it may use."""

    placement: Placement
    device: str                 # torch device string: 'cuda:N' on real GPUs, 'cpu' on a simulated pool
    visible_devices: str        # CUDA_VISIBLE_DEVICES the task runs under ('' in thread mode)
    lane: Lane | None = None    # set when a Salus executor admitted the task into a lane of its device

    @property
    def fraction(self) -> float:
        return self.placement.fraction

    @property
    def memory_cap(self) -> int:
        """Bytes of GPU memory the task may use per device (0: no cap requested; a lane's budget under Salus)."""
        return self.lane.memory_cap if self.lane else self.placement.memory

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.placement.devices

    def to_env(self) -> str:
        return json.dumps({"placement": self.placement.to_dict(), "device": self.device,
                           "visible_devices": self.visible_devices,
                           "lane": None if self.lane is None else asdict(self.lane)})

    @classmethod
    def from_env(cls, text: str) -> "TaskPlacement":
        d = json.loads(text)
        lane = Lane(**d["lane"]) if d.get("lane") else None
        return cls(Placement.from_dict(d["placement"]), d["device"], d["visible_devices"], lane)


def current_placement() -> TaskPlacement | None:
    """The placement of the task running now (None outside a GPU task runner)."""
    p = _PLACEMENT.get()
    if p is None and os.environ.get(PLACEMENT_ENV):
        p = TaskPlacement.from_env(os.environ[PLACEMENT_ENV])
    return p


def task_ledger():
    """The ledger of the pool the running task was placed by (its placement carries the pool's id):
    the runner's own in thread mode, the pool file from a worker process, the ledger actor on Ray."""
    from gpu.errors import ConfigError
    from gpu.ledger import open_ledger

    tp = current_placement()
    if tp is None or not tp.placement.pool:
        raise ConfigError("placement", None, "set_resource needs a task placed by a GPU task runner")
    if tp.placement.pool.startswith("ray:"):
        from tasks.ray_runner import attach

        return attach(tp.placement.pool)
    return open_ledger(tp.placement.pool)


def set_resource(name: str, capacity: float, node: str | None = None) -> None:
    """ESCHER's ``set_resource`` from inside a task: ``node=None`` is the task's own node (ESCHER
    Listing 1, primitive P1), unlike the ledger's ``set_resource`` where None means every node."""
    tp = current_placement()
    task_ledger().set_resource(name, capacity, node or (tp.placement.node if tp else None))


@contextmanager
def placed(placement: TaskPlacement | None) -> Iterator[None]:
    """Make ``placement`` what ``current_placement()`` returns in this context (thread mode)."""
    token = _PLACEMENT.set(placement)
    try:
        yield
    finally:
        _PLACEMENT.reset(token)
