"""ESCHER: scheduling policies as ephemeral resources over the pool ledger.

ESCHER (Bhardwaj, "Expressive Scheduling with Ephemeral Resources", thesis ch. 4 / SoCC '21) keeps the
scheduler to one service, "satisfying per-task resource constraints", and writes every policy as
``set_resource`` calls plus resource requirements (§4.3, Listing 1). The ledger (``gpu.ledger``, the Ray
ledger actor, or the simulator's ``gpu.sim.escher.ledger.SimLedger``) is that scheduler; this module is
the thin layer an ESCHER Scheduling Library (ESL) talks through:

* ``Escher``: Listing 1's ``set_resource(name, capacity, node_spec)`` and ``get_cluster_status()``,
  ``delete_resource`` (capacity 0, as the Ray prototype did), the atomic ``adjust_resource`` of §4.5's
  delta log, and a persisted log of every call so an ESL replays its resources after a node is lost or
  it restarts (§4.3 "Fault tolerance").
* ``NodeSpec``: a resource vector (+ ``num_nodes``) that picks nodes by availability (§4.3).
* ``SetResource`` / ``Actions``: the frozen decisions the ESL monitors (elastic load balancing, HFS)
  return; a world applies them with ``Escher.apply``.
* ``all_of``: AND-composition, "concatenating the ephemeral resource vectors" (§4.4h).

The policies themselves live beside it: ``escher_primitives`` (P1–P4, Table 4.2, bin packing, WFQ),
``escher_gang`` (§4.4e's three designs), ``escher_hfs`` (§4.4f) and ``escher_soft`` (§4.4g).

Example::

    esl = Escher(ledger, caller_node="node0")
    esl.set_resource("load_bal", 1, NodeSpec({"CPU": 1}))        # every node with a free CPU
    request = ResourceRequest(cpus=1, resources=all_of({"load_bal": 1}, {"data-7": 1}))
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping, Protocol, Sequence

from gpu.errors import ConfigError
from gpu.scenario import integer, positive

log = logging.getLogger("gpuflows.escher")

UNBOUNDED = 1e6
"""The "unbounded"/"infinite" capacity of P1 and HFS resources (§4.4): large and finite, as the ledger
stores finite numbers (ESCHER's Ray prototype had the same limit)."""


class ResourceLedger(Protocol):
    """What ESCHER needs of a scheduler: resource matching plus these calls (``gpu.ledger.LedgerClient``); a
    monitor reads ``leases`` to see where tasks run (HFS keeps a user's busy nodes)."""

    def set_resource(self, name: str, capacity: float, node: str | None = None) -> None: ...

    def adjust_resource(self, name: str, delta: float, node: str | None = None) -> dict[str, float]: ...

    def cluster_status(self) -> dict[str, dict[str, tuple[float, float]]]: ...

    def leases(self) -> list: ...


@dataclass(frozen=True)
class NodeSpec:
    """Nodes chosen by a resource vector: every node whose *available* resources cover ``resources``
    (§4.3; availability, not total, per our reading), or the first ``num_nodes`` of them in node order."""

    resources: Mapping[str, float] = field(default_factory=dict)
    num_nodes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.resources, Mapping):
            raise ConfigError("node_spec.resources", self.resources, "must map resource names to amounts")
        object.__setattr__(self, "resources", {k: positive(v, f"node_spec.resources[{k!r}]", allow_zero=True)
                                               for k, v in self.resources.items()})
        if self.num_nodes is not None:
            object.__setattr__(self, "num_nodes", integer(self.num_nodes, "node_spec.num_nodes", minimum=1))

    def matches(self, available: Mapping[str, tuple[float, float]]) -> bool:
        return all(available.get(k, (0.0, 0.0))[1] + 1e-9 >= v for k, v in self.resources.items())


@dataclass(frozen=True)
class SetResource:
    """One ``set_resource`` call on one node (capacity 0 deletes); ``spec`` is how its node was chosen,
    kept so a replay after node loss picks another node the same way."""

    name: str
    capacity: float
    node: str
    spec: NodeSpec | None = None


@dataclass(frozen=True)
class Actions:
    """What an ESL monitor decided: ``set_resource`` calls and ``adjust_resource`` deltas (name, delta, node)."""

    calls: tuple[SetResource, ...] = ()
    deltas: tuple[tuple[str, float, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.calls or self.deltas)


def resolve_nodes(node_spec: str | NodeSpec | None, status: Mapping[str, Mapping[str, tuple[float, float]]],
                  caller: str | None) -> tuple[str, ...]:
    """The nodes ``node_spec`` names (Listing 1): None the caller's node, a node id that node, a
    ``NodeSpec`` the matching nodes in node order; unknown nodes and ``num_nodes`` above the matches fail."""
    if node_spec is None:
        if caller is None:
            raise ConfigError("node_spec", None, "None means the caller's node, and this ESL has no caller node")
        node_spec = caller
    if isinstance(node_spec, str):
        if node_spec not in status:
            raise ConfigError("node_spec", node_spec, f"no such node (nodes: {sorted(status)})")
        return (node_spec,)
    if not isinstance(node_spec, NodeSpec):
        raise ConfigError("node_spec", node_spec, "must be a node id, a NodeSpec or None")
    matches = tuple(n for n in sorted(status) if node_spec.matches(status[n]))
    if node_spec.num_nodes is not None:
        if node_spec.num_nodes > len(matches):
            raise ConfigError("node_spec.num_nodes", node_spec.num_nodes,
                              f"only {len(matches)} node(s) match {dict(node_spec.resources)}")
        matches = matches[: node_spec.num_nodes]
    return matches


def all_of(*vectors: Mapping[str, float]) -> dict[str, float]:
    """AND-composition of policies (§4.4h): the concatenated requirement vectors, quantities of a
    resource named twice summed (the paper is silent; summing keeps both policies' demands)."""
    out: dict[str, float] = {}
    for vector in vectors:
        for name, amount in vector.items():
            if name in out:
                log.warning("ESCHER composition: %r is required by two policies; asking for the sum", name)
            out[name] = out.get(name, 0.0) + float(amount)
    return out


class Escher:
    """An ESL's handle on the scheduler: Listing 1's API over any ``ResourceLedger``, with a log for replay.

    Args:
        ledger: the scheduler (``PoolLedger``, ``RayLedger`` or the simulator's ``SimLedger``).
        caller_node: the node ``node_spec=None`` means (a task's own node; None for a driver, which
            then must name nodes).
        log_path: a JSON-lines file keeping every call, read back on start so a restarted ESL can
            ``replay()`` (§4.3; the paper leaves the ESL's own durability open).
    """

    def __init__(self, ledger: ResourceLedger, caller_node: str | None = None, log_path: str | None = None):
        self.ledger = ledger
        self.caller_node = caller_node
        self.log_path = log_path
        self._log: dict[tuple[str, str], SetResource] = {}
        if log_path and os.path.exists(log_path):
            with open(log_path) as f:
                for line in f:
                    if line.strip():
                        self._remember(_call_from_dict(json.loads(line)), persist=False)

    # -- Listing 1 ---------------------------------------------------------------------------------
    def set_resource(self, name: str, capacity: float, node_spec: str | NodeSpec | None = None,
                     *, label: str | None = None) -> tuple[str, ...]:
        """Create or resize ``name`` on the nodes ``node_spec`` names (0 deletes); the nodes it touched.
        ``label`` is the paper's alternative name for ``name`` (Fig. 4.4b)."""
        name = label if label is not None else name
        if not isinstance(name, str) or not name:
            raise ConfigError("resource name", name, "must be a non-empty string")
        capacity = positive(capacity, f"resources[{name!r}].capacity", allow_zero=True)
        nodes = resolve_nodes(node_spec, self.ledger.cluster_status(), self.caller_node)
        spec = node_spec if isinstance(node_spec, NodeSpec) else None
        self.apply(Actions(tuple(SetResource(name, capacity, n, spec) for n in nodes)))
        return nodes

    def delete_resource(self, name: str, node_spec: str | NodeSpec | None = None) -> tuple[str, ...]:
        return self.set_resource(name, 0, node_spec)

    def adjust_resource(self, name: str, delta: float, node_spec: str | NodeSpec | None = None) -> dict[str, float]:
        """Add ``delta`` atomically on each node ``node_spec`` names (§4.5's delta log); the new capacities."""
        nodes = resolve_nodes(node_spec, self.ledger.cluster_status(), self.caller_node)
        out: dict[str, float] = {}
        for n in nodes:
            out.update(self.ledger.adjust_resource(name, delta, n))
            self._remember(SetResource(name, out[n], n))
        return out

    def get_cluster_status(self) -> dict[str, dict[str, tuple[float, float]]]:
        """node -> resource -> (capacity, available): an advisory snapshot, racy by nature (the paper calls availability unexposed in §4.7)."""
        return self.ledger.cluster_status()

    # -- decisions and the log ---------------------------------------------------------------------
    def apply(self, actions: Actions) -> None:
        """Carry out a monitor's decision on the ledger, logging each call."""
        for call in actions.calls:
            self.ledger.set_resource(call.name, call.capacity, call.node)
            self._remember(call)
        for name, delta, node in actions.deltas:
            new = self.ledger.adjust_resource(name, delta, node)[node]
            self._remember(SetResource(name, new, node))

    def logged(self) -> list[SetResource]:
        """The resources this ESL created and still keeps, one per (name, node)."""
        return list(self._log.values())

    def _remember(self, call: SetResource, persist: bool = True) -> None:
        key = (call.name, call.node)
        if call.capacity == 0:
            self._log.pop(key, None)
        else:
            self._log[key] = call
        if persist and self.log_path:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(_call_to_dict(call)) + "\n")

    def replay(self) -> Actions:
        """Restore every logged resource (§4.3 "Fault tolerance"): on its node when that node is alive,
        else on another eligible node — one its ``NodeSpec`` matches (any alive node lacking the
        resource when it had none). A resource with no eligible node waits for the next replay."""
        status = self.ledger.cluster_status()
        calls, moved = [], []
        for call in self.logged():
            if call.node in status:
                if status[call.node].get(call.name, (None,))[0] != call.capacity:
                    calls.append(call)
                continue
            taken = {c.node for c in self.logged() if c.name == call.name} | {c.node for c in calls if c.name == call.name}
            spare = [n for n in sorted(status) if n not in taken
                     and (call.spec is None or call.spec.matches(status[n]))]
            if spare:
                moved.append(call)
                calls.append(SetResource(call.name, call.capacity, spare[0], call.spec))
        for call in moved:
            self._remember(replace(call, capacity=0.0))     # logged as gone from the lost node
        actions = Actions(tuple(calls))
        self.apply(actions)
        return actions


def _call_to_dict(call: SetResource) -> dict:
    d = asdict(call)
    d["spec"] = None if call.spec is None else {"resources": dict(call.spec.resources), "num_nodes": call.spec.num_nodes}
    return d


def _call_from_dict(d: Mapping) -> SetResource:
    spec = d.get("spec")
    return SetResource(d["name"], float(d["capacity"]), d["node"], None if spec is None else NodeSpec(**spec))


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` whole units in proportion to ``weights`` (Hamilton's method; ties to the first)."""
    wsum = sum(weights)
    if total <= 0 or wsum <= 0:
        return [0] * len(weights)
    exact = [total * w / wsum for w in weights]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out
