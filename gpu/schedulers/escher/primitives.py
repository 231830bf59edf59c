"""ESCHER's primitives P1–P4 (§4.4) and the Table 4.2 policies built from them, as ESL calls.

Each policy is a few ``set_resource`` calls plus a requirement vector a task attaches to its
``ResourceRequest(resources=...)``; none reads a task queue or touches the ledger's matching (the paper's point:
"ESLs do not need to reason about tasks"). Names are namespaced strings (§4.5 "namespacing of resources": ``coloc-<id>``,
``done-<id>``, ``q-<name>``, ``anti-<group>``, ``lb-<name>``, ``data-<id>``).

Table 4.2, row by row:

=================  =========================================================================
Sequential         ``signal(esl, "t1")`` when T1 ends; T2 requests ``after("t1")``           (P2)
Gang               ``gpu.schedulers.escher.gang``                                            (P4+P2)
Affinity           ``colocate(esl, "t1")`` by T1 (or a ghost); T2 requests ``with_task("t1")`` (P1)
Anti-affinity      ``anti_affinity(esl, "g")``; each task requests ``{"anti-g": 1}``          (P3)
Load balancing     ``ElasticLoadBalancer`` (capacity 1 per node, +1 when all are exhausted)   (P3)
Data locality      ``store_data(esl, "d")`` where D is written; T requests ``{"data-d": 1}`` (P1)
=================  =========================================================================

Bin packing and weighted fair queuing have no recipe in the paper; this reading is built here:
bin packing as soft preferences over per-node resources, most-loaded node first; WFQ as one P3 queue
per class with drain capacities split in proportion to the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from gpu.errors import ConfigError
from gpu.schedulers.escher.api import UNBOUNDED, Actions, Escher, NodeSpec, SetResource, largest_remainder
from gpu.scenario import integer, positive


# -- P1 locality ----------------------------------------------------------------------------------
def colocate(esl: Escher, task_id: str, capacity: float = UNBOUNDED) -> dict[str, float]:
    """Run by the target task: make ``coloc-<task_id>`` on its own node; returns what partners request."""
    esl.set_resource(f"coloc-{task_id}", capacity)
    return with_task(task_id)


def with_task(task_id: str) -> dict[str, float]:
    """The requirement that lands a task on ``task_id``'s node (Fig. 4.4b's ``resources={i: 1}``)."""
    return {f"coloc-{task_id}": 1.0}


def store_data(esl: Escher, data_id: str) -> dict[str, float]:
    """Data locality, WordCount's first of two lines: mark the node that wrote ``data_id``."""
    esl.set_resource(f"data-{data_id}", UNBOUNDED)
    return {f"data-{data_id}": 1.0}


# -- P2 signalling --------------------------------------------------------------------------------
def signal(esl: Escher, event: str) -> None:
    """Run by T1 when it ends: create ``done-<event>`` on every node, so waiting tasks may run anywhere
    (Table 4.2 creates it on T1's node, which would also pin T2 there; a barrier over several
    producers could then never be met)."""
    esl.set_resource(f"done-{event}", UNBOUNDED, NodeSpec())


def after(*events: str) -> dict[str, float]:
    """The requirement of a task that runs once every one of ``events`` signalled (sequence, barrier)."""
    if not events:
        raise ConfigError("events", events, "name at least one event to wait for")
    return {f"done-{e}": 1.0 for e in events}


# -- P3 queues ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Queue:
    """A P3 queue: ``q-<name>``, capacity 0 (absent) until released. A wrapper task requests
    ``requirement``, then ``take``s its unit (capacity −1) and submits the real task: capacity is the
    number of releases left, so ``release(k)`` lets exactly k wrapped tasks through (batching)."""

    name: str
    node: str

    @property
    def resource(self) -> str:
        return f"q-{self.name}"

    @property
    def requirement(self) -> dict[str, float]:
        return {self.resource: 1.0}

    def release(self, esl: Escher, k: int = 1) -> None:
        esl.adjust_resource(self.resource, integer(k, "k", minimum=1), self.node)

    def take(self, esl: Escher) -> None:
        esl.adjust_resource(self.resource, -1, self.node)


@dataclass(frozen=True)
class WeightedFairQueues:
    """Weighted fair queuing (Table 4.1; our recipe): one ``Queue`` per class; ``release(esl, k)`` splits k releases
    across the classes with backlog in proportion to their weights (largest remainder)."""

    weights: Mapping[str, float]
    node: str

    def __post_init__(self) -> None:
        if not self.weights:
            raise ConfigError("weights", self.weights, "name at least one class")
        for c, w in self.weights.items():
            positive(w, f"weights[{c!r}]")

    def queue(self, cls: str) -> Queue:
        if cls not in self.weights:
            raise ConfigError("class", cls, f"not one of {sorted(self.weights)}")
        return Queue(f"wfq-{cls}", self.node)

    def split(self, k: int, backlog: Mapping[str, int]) -> dict[str, int]:
        classes = [c for c in self.weights if backlog.get(c, 0) > 0]
        shares = largest_remainder(k, [self.weights[c] for c in classes])
        return {c: min(s, backlog[c]) for c, s in zip(classes, shares) if s}

    def release(self, esl: Escher, k: int, backlog: Mapping[str, int]) -> dict[str, int]:
        split = self.split(k, backlog)
        for c, n in split.items():
            self.queue(c).release(esl, n)
        return split


# -- P4-free spreading ----------------------------------------------------------------------------
def anti_affinity(esl: Escher, group: str) -> dict[str, float]:
    """Tasks of ``group`` on distinct nodes: ``anti-<group>`` with capacity 1 on every node (Table 4.2)."""
    esl.set_resource(f"anti-{group}", 1, NodeSpec())
    return {f"anti-{group}": 1.0}


@dataclass
class ElasticLoadBalancer:
    """Elastic load balancing (Table 4.2): ``lb-<name>`` capacity 1 per node; the monitor raises
    every node's capacity by 1 when all are exhausted and work waits. A ``gpu.contract.Controller``:
    the world calls ``on_arrival`` on each submission and ``on_job_done`` on each end with the status."""

    name: str = "default"
    system: str = "escher"
    policy: str = "load_balance"
    hooks: tuple[str, ...] = ("on_arrival", "on_job_done")

    @property
    def resource(self) -> str:
        return f"lb-{self.name}"

    @property
    def requirement(self) -> dict[str, float]:
        return {self.resource: 1.0}

    def setup(self, status: Mapping[str, Mapping[str, tuple[float, float]]]) -> Actions:
        return Actions(tuple(SetResource(self.resource, 1.0, n) for n in sorted(status)))

    def on_arrival(self, now: float, status: Mapping[str, Mapping[str, tuple[float, float]]], pending: int) -> Actions:
        """Grow by one per node when every node's ``lb`` is used up and ``pending`` tasks wait for it."""
        have = [status[n][self.resource] for n in status if self.resource in status[n]]
        if pending <= 0 or not have or any(avail >= 1 - 1e-9 for _, avail in have):
            return Actions()
        return Actions(deltas=tuple((self.resource, 1.0, n) for n in sorted(status) if self.resource in status[n]))

    def on_job_done(self, now: float, status: Mapping[str, Mapping[str, tuple[float, float]]], pending: int) -> Actions:
        return self.on_arrival(now, status, pending)


# -- bin packing (Table 4.1; our recipe) -----------------------------------------------------------------------
def pack_resource(node: str) -> str:
    return f"pack-{node}"


def bin_packing(esl: Escher) -> None:
    """Give every node its own unbounded ``pack-<node>`` resource (set once)."""
    for node in sorted(esl.get_cluster_status()):
        esl.set_resource(pack_resource(node), UNBOUNDED, node)


def packing_preferences(status: Mapping[str, Mapping[str, tuple[float, float]]],
                        request: Mapping[str, float]) -> list[dict[str, float]]:
    """Soft preferences for bin packing: nodes that can take ``request`` now, most loaded (fewest
    free CPUs) first, so new work fills used nodes before opening idle ones."""
    fits = [n for n in status if all(status[n].get(k, (0, 0))[1] + 1e-9 >= v for k, v in request.items())]
    order = sorted(fits, key=lambda n: (status[n]["CPU"][1] / max(status[n]["CPU"][0], 1e-9), n))
    return [{pack_resource(n): 1.0} for n in order]
