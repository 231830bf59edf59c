"""The simulator's scheduler for ESCHER: a ledger in memory, matching through ``gpu.placement``.

ESCHER's SimBackend (thesis §4.6 reproduced on one machine): nodes are physical capacities plus
ephemeral resources; waiting requests are planned with the same ``plan_grants`` / ``apply_choice``
the pool ledger uses, under the same ``PlacementPolicy``. It is ``LedgerClient``-shaped (``submit``,
``try_grant``, ``cancel``, ``release``, ``set_resource``, ``adjust_resource``, ``cluster_status``,
``free_state``, ``grant_all``), so the ESLs in ``gpu.schedulers.escher.api*`` are the same objects here and
on a real pool. It has no clock: it tells its ``on_grant`` listener what it granted, and the simulator
(``gpu.sim.escher.run``) decides when things happen. Nodes can fail and come back (fault-tolerance replay).
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

from gpu.devices import PoolSpec
from gpu.errors import ConfigError, LeaseLost
from gpu.ledger import LedgerClient, Lease, status_of
from gpu.placement import (
    DeviceState, FifoBestFit, NodeState, PlacementPolicy, ResourceRequest, Waiting, apply_choice, check_ever_fits,
    choose_all, plan_grants,
)
from gpu.scenario import number, positive


class SimLedger(LedgerClient):
    """An in-memory ledger for the event-driven simulator (no threads, no clock, no SQLite)."""

    def __init__(self, spec: PoolSpec, policy: PlacementPolicy | None = None,
                 on_grant: Callable[[int, Lease], None] | None = None):
        super().__init__()
        self.policy = policy or FifoBestFit()
        self.on_grant = on_grant
        self.pool_id = "sim"
        self.capacity = [NodeState(n.name, tuple(DeviceState(d.index, d.memory_total) for d in n.devices), n.cpus, n.cpus)
                         for n in spec.nodes]
        self._alive = {n.name for n in self.capacity}
        self._free = {n.name: n for n in self.capacity}
        self._caps: dict[str, dict[str, float]] = {n.name: {} for n in self.capacity}
        self._used: dict[str, dict[str, float]] = {n.name: {} for n in self.capacity}
        self._waiting: dict[int, Waiting] = {}
        self._granted: dict[int, Lease] = {}
        self._leases: dict[str, tuple[Lease, ResourceRequest]] = {}
        self._backed: dict[tuple[str, str], str] = {}          # (node, resource) -> the ghost lease behind it
        self._tickets = itertools.count(1)
        self._lease_ids = itertools.count(1)
        self.grants = 0

    # -- state --------------------------------------------------------------------------------
    def free_state(self) -> list[NodeState]:
        out = []
        for n in self.capacity:
            if n.name not in self._alive:
                continue
            f = self._free[n.name]
            res = {k: cap - self._used[n.name].get(k, 0.0) for k, cap in self._caps[n.name].items()}
            out.append(NodeState(n.name, f.devices, f.cpus_total, f.cpus_free, res, dict(self._caps[n.name])))
        return out

    def cluster_status(self) -> dict[str, dict[str, tuple[float, float]]]:
        rows = [(n, k, cap) for n in self._caps if n in self._alive for k, cap in self._caps[n].items()]
        return status_of(self.free_state(), rows)

    def waiting(self) -> int:
        return len(self._waiting)

    def leases(self) -> list[Lease]:
        return [p for p, _ in self._leases.values()]

    # -- resources ----------------------------------------------------------------------------
    def _node(self, node: str | None) -> list[str]:
        if node is None:
            return sorted(self._alive)
        if node not in self._alive:
            raise ConfigError("node", node, f"not an alive node (nodes: {sorted(self._alive)})")
        return [node]

    def set_resource(self, name: str, capacity: float, node: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError("resource name", name, "must be a non-empty string")
        capacity = positive(capacity, f"resources[{name!r}].capacity", allow_zero=True)
        for n in self._node(node):
            if capacity == 0:
                self._caps[n].pop(name, None)
            else:
                self._caps[n][name] = capacity
        self._plan()

    def adjust_resource(self, name: str, delta: float, node: str | None = None) -> dict[str, float]:
        out = {}
        for n in self._node(node):
            out[n] = max(0.0, self._caps[n].get(name, 0.0) + number(delta, f"resources[{name!r}].delta"))
            if out[n] == 0:
                self._caps[n].pop(name, None)
            else:
                self._caps[n][name] = out[n]
        self._plan()
        return out

    def lease_resource(self, lease_id: str, name: str, capacity: float) -> None:
        """A GPU ghost's resource, as ``PoolLedger.lease_resource``: on the lease's node, its grants run on the
        lease's devices, and it is deleted with the lease."""
        if lease_id not in self._leases:
            raise LeaseLost(f"lease {lease_id} is not held")
        node = self._leases[lease_id][0].node
        self._caps[node][name] = positive(capacity, f"resources[{name!r}].capacity")
        self._backed[(node, name)] = lease_id
        self._plan()

    # -- requests -----------------------------------------------------------------------------
    def submit(self, request: ResourceRequest, priority: float = 0.0) -> int:
        check_ever_fits(request, self.capacity)
        ticket = next(self._tickets)
        self._waiting[ticket] = Waiting(ticket, request, priority)
        self._plan()
        return ticket

    def try_grant(self, ticket: int) -> Lease | None:
        """The lease of ``ticket`` while it is held (asked again, the same lease), None while it waits."""
        placement = self._granted.get(ticket)
        return self._hold(placement) if placement is not None and placement.lease_id in self._leases else None

    def cancel(self, ticket: int) -> None:
        """Withdraw ``ticket``; a grant not yet taken up (``try_grant``) is released."""
        self._waiting.pop(ticket, None)
        placement = self._granted.pop(ticket, None)
        if placement is not None and placement.lease_id not in self._held:
            self.release(placement.lease_id)

    def release(self, lease_id: str) -> bool:
        self._held.pop(lease_id, None)
        entry = self._leases.pop(lease_id, None)
        if entry is None:
            return False
        placement, request = entry
        if placement.node in self._alive:
            self._give_back(placement, request)
        for key in [k for k, lease in self._backed.items() if lease == lease_id]:
            del self._backed[key]
            self._caps[key[0]].pop(key[1], None)
        self._plan()
        return True

    def grant_all(self, requests: Sequence[ResourceRequest]) -> list[Lease] | None:
        """All-or-none in one step (FrameSpace): the same rule as ``PoolLedger.grant_all``."""
        choices = choose_all(self.policy, requests, self.free_state())
        if choices is None:
            return None
        return [self._hold(self._lease(request, choice)) for request, choice in zip(requests, choices)]

    # -- faults ---------------------------------------------------------------------------------
    def fail_node(self, node: str) -> list[Lease]:
        """The node is gone with its ephemeral resources; the leases on it are lost (returned)."""
        self._node(node)
        self._alive.discard(node)
        self._caps[node] = {}
        self._backed = {k: v for k, v in self._backed.items() if k[0] != node}
        lost = [p for p, _ in self._leases.values() if p.node == node]
        for p in lost:
            del self._leases[p.lease_id]
            self._held.pop(p.lease_id, None)
        self._used[node] = {}
        self._free[node] = next(n for n in self.capacity if n.name == node)
        return lost

    def restore_node(self, node: str) -> None:
        """The node is back, empty: "its resources are also reinitialized" by the ESL's replay."""
        if node not in self._free:
            raise ConfigError("node", node, "not a node of this pool")
        self._alive.add(node)
        self._plan()

    # -- matching -------------------------------------------------------------------------------
    def _lease(self, request: ResourceRequest, choice) -> Lease:
        ghost = None if request.uses_gpu else next(
            (self._leases[self._backed[(choice.node, k)]][0] for k in request.resources
             if (choice.node, k) in self._backed), None)
        devices, fraction, memory = (ghost.devices, ghost.fraction, ghost.memory) if ghost else \
            (choice.devices, choice.fraction, choice.memory)
        placement = Lease(f"sim-{next(self._lease_ids)}", choice.node, devices, fraction, memory, request.cpus,
                              dict(request.resources), request.label, True, 0.0, 0, self.pool_id)
        self._leases[placement.lease_id] = (placement, request)
        self._free[choice.node] = apply_choice([self._free[choice.node]], request, choice)[0]
        used = self._used[choice.node]
        for k, v in request.resources.items():
            used[k] = used.get(k, 0.0) + v
        self.grants += 1
        return placement

    def _give_back(self, placement: Lease, request: ResourceRequest) -> None:
        f = self._free[placement.node]
        lent = not request.uses_gpu        # devices a ghost lent (or none): the ghost's lease accounts for them
        devices = tuple(DeviceState(d.index, d.memory_total, d.compute_free + placement.fraction,
                                    d.memory_free + placement.memory) if d.index in placement.devices and not lent
                        else d for d in f.devices)
        self._free[placement.node] = NodeState(f.name, devices, f.cpus_total, f.cpus_free + request.cpus)
        used = self._used[placement.node]
        for k, v in request.resources.items():
            used[k] = used.get(k, 0.0) - v

    def _plan(self) -> None:
        """Grant what the policy grants now and tell the listener (which may release or submit: those plan again)."""
        if not self._waiting:
            return
        grants = plan_grants(self.policy, list(self._waiting.values()), self.free_state())
        for ticket, choice in grants.items():
            self._granted[ticket] = self._lease(self._waiting.pop(ticket).request, choice)
        if self.on_grant is not None:
            for ticket in grants:
                if ticket in self._granted:
                    self.on_grant(ticket, self._granted[ticket])
