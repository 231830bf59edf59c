"""What a task asks of the pool, where it lands, and the policy that decides both.

The ledger owns the state; this module holds the pure decision: given what is free and who
waits, which waiting requests are granted now and on which devices. Later schedulers plug in
by implementing ``PlacementPolicy`` (order and device choice), never by touching the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Iterable, Mapping, Protocol, Sequence

from gpu.errors import ConfigError, NeverFitsError
from gpu.scenario import positive
from gpu.units import format_memory, parse_memory

_EPS = 1e-9


@dataclass(frozen=True)
class ResourceRequest:
    """A task's demand: GPUs (a fraction < 1 shares one device; >= 1 means whole devices),
    GPU memory per device, CPUs, named ephemeral resources, and an optional node.

    ``devices`` restricts the request to those device indices (of ``node`` when given, of any node
    otherwise): a scheduler that has already decided *where* a job runs (FLUID's GPU for a trial,
    an affinity rule, a DAG placement) pins it there instead of letting best fit choose.
    """

    gpus: float = 0.0
    memory: int = 0
    cpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    node: str | None = None
    label: str = ""
    devices: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        # the ledger stores label and node in SQLite rows that every process plans from
        if not isinstance(self.label, str):
            raise ConfigError("label", self.label, "must be a string")
        if self.node is not None and (not isinstance(self.node, str) or not self.node):
            raise ConfigError("node", self.node, "must be a node name (a non-empty string) or None")
        object.__setattr__(self, "memory", parse_memory(self.memory, "memory"))
        if self.devices is not None:
            pinned = tuple(self.devices)
            if (not pinned or len(set(pinned)) != len(pinned)
                    or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in pinned)):
                raise ConfigError("devices", self.devices, "must be distinct device indices >= 0")
            object.__setattr__(self, "devices", pinned)
        # the ledger stores these in SQLite, where NaN becomes NULL and breaks every later grant on the pool
        gpus = positive(self.gpus, "gpus", allow_zero=True)
        if gpus > 1 and not gpus.is_integer():
            raise ConfigError("gpus", self.gpus, "a request of more than one GPU must be a whole number")
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "cpus", positive(self.cpus, "cpus", allow_zero=True))
        if not isinstance(self.resources, Mapping):
            raise ConfigError("resources", self.resources, "must map resource names to amounts")
        resources = {}
        for name, amount in self.resources.items():
            if not isinstance(name, str) or not name:
                raise ConfigError("resources", dict(self.resources), "resource names must be non-empty strings")
            resources[name] = positive(amount, f"resources[{name!r}]")
        object.__setattr__(self, "resources", resources)

    @property
    def whole_devices(self) -> int:
        """Number of whole devices asked for (0 for a fractional or memory-only request)."""
        return int(self.gpus) if self.gpus >= 1 else 0

    @property
    def uses_gpu(self) -> bool:
        return self.gpus > 0 or self.memory > 0

    def describe(self) -> str:
        parts = [f"gpus={self.gpus:g}"]
        if self.memory:
            parts.append(f"memory={format_memory(self.memory)}")
        if self.cpus:
            parts.append(f"cpus={self.cpus:g}")
        if self.resources:
            parts.append(f"resources={dict(self.resources)}")
        if self.node:
            parts.append(f"node={self.node}")
        if self.devices is not None:
            parts.append(f"devices={list(self.devices)}")
        return (f"{self.label}(" if self.label else "(") + ", ".join(parts) + ")"

    def to_dict(self) -> dict:
        return {"gpus": self.gpus, "memory": self.memory, "cpus": self.cpus,
                "resources": dict(self.resources), "node": self.node, "label": self.label,
                "devices": None if self.devices is None else list(self.devices)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "ResourceRequest":
        return cls(**d)


@dataclass(frozen=True)
class DeviceState:
    """Capacity and what is free on one device (compute in GPU units, memory in bytes)."""

    index: int
    memory_total: int
    compute_free: float = 1.0
    memory_free: int = -1
    uuid: str = ""

    def __post_init__(self) -> None:
        if self.memory_free < 0:
            object.__setattr__(self, "memory_free", self.memory_total)

    @property
    def idle(self) -> bool:
        return self.compute_free >= 1 - _EPS and self.memory_free >= self.memory_total


@dataclass(frozen=True)
class NodeState:
    """One node: its devices, CPUs, and ephemeral resources free now and as configured (``resources_total``,
    the capacities set, whatever is in use)."""

    name: str
    devices: tuple[DeviceState, ...]
    cpus_total: float
    cpus_free: float
    resources_free: Mapping[str, float] = field(default_factory=dict)
    resources_total: Mapping[str, float] = field(default_factory=dict)

    def idle(self) -> "NodeState":
        """This node as configured with nothing in use: what could ever be granted on it as it is set up now."""
        return NodeState(self.name, tuple(DeviceState(d.index, d.memory_total, uuid=d.uuid) for d in self.devices),
                         self.cpus_total, self.cpus_total, self.resources_total, self.resources_total)


@dataclass(frozen=True)
class DeviceChoice:
    """Where a request lands: node, device indices, compute share and memory per device."""

    node: str
    devices: tuple[int, ...]
    fraction: float
    memory: int


@dataclass(frozen=True)
class Waiting:
    """A request waiting in the ledger's queue; ``ticket`` grows with arrival (FIFO order)."""

    ticket: int
    request: ResourceRequest
    priority: float = 0.0


class PlacementPolicy(Protocol):
    """Decides the order of waiting requests and the device choice for each."""

    backfill: bool

    def order(self, waiting: Sequence[Waiting]) -> list[Waiting]: ...

    def choose(self, request: ResourceRequest, nodes: Sequence[NodeState]) -> DeviceChoice | None: ...


def _node_admits(request: ResourceRequest, node: NodeState) -> bool:
    if request.node is not None and request.node != node.name:
        return False
    if node.cpus_free + _EPS < request.cpus:
        return False
    return all(node.resources_free.get(k, 0.0) + _EPS >= v for k, v in request.resources.items())


def candidate_choices(request: ResourceRequest, nodes: Sequence[NodeState]) -> Iterable[tuple[float, DeviceChoice]]:
    """Every feasible landing spot with its leftover (smaller is a tighter fit)."""
    for node in nodes:
        if not _node_admits(request, node):
            continue
        if not request.uses_gpu:
            yield node.cpus_free - request.cpus, DeviceChoice(node.name, (), 0.0, 0)
            continue
        devices = [d for d in node.devices if request.devices is None or d.index in request.devices]
        if request.whole_devices:
            idle = [d for d in devices if d.idle and d.memory_total >= request.memory]
            if len(idle) >= request.whole_devices:
                picked = tuple(d.index for d in idle[: request.whole_devices])
                yield float(len(idle) - request.whole_devices), DeviceChoice(node.name, picked, 1.0, request.memory or idle[0].memory_total)
            continue
        for d in devices:
            share = request.gpus if request.gpus > 0 else request.memory / d.memory_total
            if d.compute_free + _EPS >= share and d.memory_free >= request.memory:
                leftover = (d.compute_free - share) + (d.memory_free - request.memory) / max(d.memory_total, 1) * 1e-3
                yield leftover, DeviceChoice(node.name, (d.index,), share, request.memory)


@dataclass
class FifoBestFit:
    """Default policy: first come, first served; each request on the tightest device that fits.

    With ``backfill=False`` the head of the queue blocks later requests (no starvation of big
    requests); with ``backfill=True`` later requests that fit may go first (higher utilisation).
    """

    backfill: bool = False
    sql_order: ClassVar[str] = "priority DESC, id"  # ``order`` as the ledger's SQL sorts tickets

    def order(self, waiting: Sequence[Waiting]) -> list[Waiting]:
        return sorted(waiting, key=lambda w: (-w.priority, w.ticket))

    def choose(self, request: ResourceRequest, nodes: Sequence[NodeState]) -> DeviceChoice | None:
        best = min(candidate_choices(request, nodes), key=lambda c: c[0], default=None)
        return best[1] if best else None


def apply_choice(nodes: Sequence[NodeState], request: ResourceRequest, choice: DeviceChoice) -> list[NodeState]:
    """The node states after granting ``choice`` (used to plan several grants in one pass)."""
    out = []
    for node in nodes:
        if node.name != choice.node:
            out.append(node)
            continue
        devices = tuple(
            DeviceState(d.index, d.memory_total, d.compute_free - choice.fraction, d.memory_free - choice.memory, d.uuid)
            if d.index in choice.devices else d
            for d in node.devices
        )
        res = dict(node.resources_free)
        for k, v in request.resources.items():
            res[k] = res.get(k, 0.0) - v
        out.append(NodeState(node.name, devices, node.cpus_total, node.cpus_free - request.cpus, res,
                             node.resources_total))
    return out


def choose_all(policy: PlacementPolicy, requests: Sequence[ResourceRequest],
               nodes: Sequence[NodeState]) -> list[DeviceChoice] | None:
    """Where every one of ``requests`` goes at once (all or none: ESCHER's gang grant), or None if one misfits."""
    choices = []
    for request in requests:
        choice = policy.choose(request, nodes)
        if choice is None:
            return None
        choices.append(choice)
        nodes = apply_choice(nodes, request, choice)
    return choices


def configured(nodes: Sequence[NodeState]) -> list[NodeState]:
    """``nodes`` as configured, idle (``NodeState.idle``): what ``waits_off_head`` compares a request with."""
    return [n.idle() for n in nodes]


def waits_off_head(request: ResourceRequest, configured_nodes: Sequence[NodeState]) -> bool:
    """Whether ``request`` fits no single node *as the nodes are configured now* (``configured``: capacities,
    not what is in use), so that waiting at the head of a FIFO queue would block every later request forever.

    Only a request naming ephemeral resources can be here (the physical rest is refused at submit when it never
    fits, ``check_ever_fits``): a resource nobody created yet (ESCHER's task signalling, P2: a consumer queued
    before its producer), a barrier whose signals live on different nodes, a data-local task asking more CPUs
    or GPUs than the data's node has, more of a resource than its capacity. Each may become satisfiable when a
    resource is created or changed, so it keeps its ticket and its own timeout, but is passed over: ESCHER's
    guarantee that a task whose requirements can be met is eventually scheduled (§4.3) holds under FIFO.
    """
    return bool(request.resources) and not any(True for _ in candidate_choices(request, configured_nodes))


def plan_grants(policy: PlacementPolicy, waiting: Sequence[Waiting], nodes: Sequence[NodeState],
                until: int | None = None) -> dict[int, DeviceChoice]:
    """Which waiting tickets the policy grants now, in its order (stopping at the first misfit
    unless the policy backfills; a request that fits no node as configured now is passed over,
    see ``waits_off_head``). With ``until``, stop once that ticket is decided: tickets after it in
    the order cannot change its grant."""
    grants: dict[int, DeviceChoice] = {}
    as_configured = configured(nodes)
    for w in policy.order(waiting):
        if waits_off_head(w.request, as_configured):
            if w.ticket == until:
                break
            continue
        choice = policy.choose(w.request, nodes)
        if choice is None:
            if policy.backfill and w.ticket != until:
                continue
            break
        grants[w.ticket] = choice
        if w.ticket == until:
            break
        nodes = apply_choice(nodes, w.request, choice)
    return grants


def check_ever_fits(request: ResourceRequest, capacity: Sequence[NodeState]) -> None:
    """Raise NeverFitsError when ``request`` cannot fit even an empty pool.

    Ephemeral resources are not checked: they may be created later (ESCHER's task signalling).
    """
    empty = [n.idle() for n in capacity]
    physical = replace(request, resources={})  # checked without them: O(nodes), not O(nodes x resources)
    if any(True for _ in candidate_choices(physical, empty)):
        return
    totals = ", ".join(
        f"{n.name}: {len(n.devices)} GPU(s) of "
        f"{'/'.join(sorted({format_memory(d.memory_total) for d in n.devices})) or '-'}, {n.cpus_total:g} CPUs"
        for n in capacity
    )
    raise NeverFitsError(f"request {request.describe()} can never fit this pool ({totals})")
