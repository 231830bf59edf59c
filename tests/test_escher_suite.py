"""ESCHER's policy suite (thesis §4.4, Table 4.2, §4.3 fault tolerance) once, on every ledger an ESL runs on.

Each ``check_*`` drives the same ESL objects (``gpu.schedulers.escher``) through a ``Backend``: here the
simulator's ``SimLedger`` and the local pool ledger (a pool file of three simulated nodes), and in
``tests/test_ray_runner.py`` the Ray ledger actor of the two-node cluster fixture (imported from here:
a fixture shared across modules would start a second cluster). Cases read node names and capacities
from ``cluster_status()``, so the same code holds on 3 ``node<i>`` nodes and on 2 Ray node ids. After every
grant, ``granted`` checks that no node is over capacity (§4.3's guarantee).
"""

from __future__ import annotations

import threading
import uuid
from typing import Callable

import numpy as np
import pytest

from gpu.devices import PoolSpec, simulated_nodes
from gpu.errors import AllocationTimeout
from gpu.ledger import Lease
from gpu.placement import FifoBestFit, ResourceRequest
from gpu.pool import open_pool
from gpu.schedulers.escher.api import Escher, NodeSpec, all_of
from gpu.schedulers.escher.gang import AppSpaceGang, Gang
from gpu.schedulers.escher.primitives import (
    ElasticLoadBalancer, Queue, after, anti_affinity, colocate, signal, store_data,
)
from gpu.schedulers.escher.soft import SoftConstraint
from gpu.sim.escher.ledger import SimLedger
from resource_blocks import GpuPool

DEVICES = "2x16GiB"  # per node, as on the Ray fixture's nodes
SPEC = simulated_nodes(DEVICES, 3)


# -- backends -------------------------------------------------------------------------------------
class Backend:
    """A ledger the ESLs run on, and what its world does when a node leaves (``lose_node``) or comes back."""

    name = ""
    ledger = None
    policy = FifoBestFit()  # strict FIFO, the ledgers' default (the signalling case needs it)

    def nodes(self) -> list[str]:
        return sorted(self.ledger.cluster_status())

    def lose_node(self, node: str) -> None:
        raise NotImplementedError

    def restore_node(self, node: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.ledger.close()


class SimBackend(Backend):
    """The simulator's ledger: nodes fail and return in memory."""

    name = "sim"

    def __init__(self) -> None:
        self.ledger = SimLedger(SPEC, self.policy)

    def lose_node(self, node: str) -> None:
        self.ledger.fail_node(node)

    def restore_node(self, node: str) -> None:
        self.ledger.restore_node(node)


class LocalBackend(Backend):
    """The local pool ledger of ``GpuPool(nodes=3, device_backend="simulated")``; a node leaves when the
    pool is reopened without it (its ephemeral resources go with it) and returns when reopened with it."""

    name = "local"

    def __init__(self) -> None:
        self.pool = GpuPool(name=f"escher-suite-{uuid.uuid4().hex[:8]}", device_backend="simulated",
                            simulated=DEVICES, nodes=3)
        self.ledger = self.pool.open_ledger(self.policy)
        self._all = self.ledger.spec

    def _reopen(self, keep: Callable[[str], bool]) -> None:
        self.ledger.close()
        self.ledger = open_pool(self.pool.name, spec=PoolSpec(tuple(n for n in self._all.nodes if keep(n.name))),
                                policy=self.policy)

    def lose_node(self, node: str) -> None:
        self._reopen(lambda n: n != node)

    def restore_node(self, node: str) -> None:
        self._reopen(lambda n: True)


@pytest.fixture(params=[SimBackend, LocalBackend], ids=["sim", "local"])
def backend(request, state_dir):
    b = request.param()
    yield b
    b.close()


# -- helpers --------------------------------------------------------------------------------------
def over_capacity(ledger) -> list[str]:
    """What is allocated past capacity anywhere: device compute or memory, node CPUs, an ephemeral resource."""
    bad = []
    for n in ledger.free_state():
        bad += [f"{n.name}:gpu{d.index}" for d in n.devices if d.compute_free < -1e-9 or d.memory_free < 0]
        bad += [f"{n.name}:CPU"] if n.cpus_free < -1e-9 else []
        bad += [f"{n.name}:{k}" for k, free in n.resources_free.items() if free < -1e-9]
    return bad


def granted(ledger, ticket: int) -> Lease | None:
    """The ticket's lease (None while it waits), checking that granting it over-committed nothing."""
    lease = ledger.try_grant(ticket)
    assert over_capacity(ledger) == []
    return lease


def grant(ledger, request: ResourceRequest) -> Lease | None:
    """Queue ``request``; its lease, or None while it waits."""
    return granted(ledger, ledger.submit(request))


def gpus_per_node(b: Backend) -> int:
    return int(min(res["GPU"][0] for res in b.ledger.cluster_status().values()))


# -- the suite ------------------------------------------------------------------------------------
def check_colocated_tasks_land_on_their_partners_node_until_it_is_full(b: Backend) -> None:
    """P1 (Table 4.2 affinity): T1 makes ``coloc-t1`` on its own node; partners land there, never elsewhere."""
    ledger, nodes = b.ledger, b.nodes()
    producer = grant(ledger, ResourceRequest(gpus=0.5, node=nodes[1], label="t1"))
    need = colocate(Escher(ledger, caller_node=producer.node), "t1")           # run by T1 (node_spec=None)
    halves = 2 * gpus_per_node(b)
    partners = [grant(ledger, ResourceRequest(gpus=0.5, resources=need)) for _ in range(halves - 1)]
    assert {p.node for p in partners} == {nodes[1]}
    waiting = ledger.submit(ResourceRequest(gpus=0.5, resources=need))
    assert granted(ledger, waiting) is None                                     # T1's node is full: it waits
    ledger.cancel(waiting)
    data = store_data(Escher(ledger, caller_node=nodes[0]), "chunk-9")          # data locality, the same way
    assert grant(ledger, ResourceRequest(resources=data)).node == nodes[0]


def check_anti_affine_tasks_run_on_distinct_nodes(b: Backend) -> None:
    """Table 4.2 anti-affinity: one task per node; one more waits until a node's task ends, then runs there."""
    ledger, nodes = b.ledger, b.nodes()
    need = anti_affinity(Escher(ledger), "trials")
    placed = [grant(ledger, ResourceRequest(gpus=0.5, resources=need)) for _ in nodes]
    assert sorted(p.node for p in placed) == nodes
    extra = ledger.submit(ResourceRequest(gpus=0.5, resources=need))
    assert granted(ledger, extra) is None
    ledger.release(placed[-1].lease_id)
    assert granted(ledger, extra).node == placed[-1].node


def check_elastic_load_balancing_stays_within_one_task_per_node(b: Backend) -> None:
    """Table 4.2 LB: ``lb-web`` 1 per node, grown by the monitor when all are used: counts differ by ≤ 1."""
    ledger = b.ledger
    esl, lb = Escher(ledger), ElasticLoadBalancer("web")
    esl.apply(lb.setup(esl.get_cluster_status()))
    tickets = []
    for i in range(10):
        tickets.append(ledger.submit(ResourceRequest(resources=lb.requirement, label=f"w{i}")))
        pending = sum(granted(ledger, t) is None for t in tickets)
        esl.apply(lb.on_arrival(float(i), esl.get_cluster_status(), pending))
    counts: dict[str, int] = {}
    for t in tickets:
        counts[granted(ledger, t).node] = counts.get(granted(ledger, t).node, 0) + 1
    assert sum(counts.values()) == 10 and set(counts) == set(b.nodes())
    assert max(counts.values()) - min(counts.values()) <= 1


def check_t2_queued_before_t1_runs_after_t1_signals_under_fifo(b: Backend) -> None:
    """P2 under strict FIFO: T2 waits off the head (its resource exists nowhere), T1 runs, then T2; a
    barrier waits for every predecessor."""
    ledger = b.ledger
    assert not b.policy.backfill
    t2 = ledger.submit(ResourceRequest(gpus=1, resources=after("t1"), label="t2"))
    t1 = grant(ledger, ResourceRequest(gpus=1, label="t1"))
    assert t1 is not None and granted(ledger, t2) is None
    ledger.release(t1.lease_id)
    assert granted(ledger, t2) is None                         # T1 ended without signalling yet
    esl = Escher(ledger)
    signal(esl, "t1")
    assert granted(ledger, t2).label == "t2"
    barrier = ledger.submit(ResourceRequest(resources=after("t1", "t3")))
    assert granted(ledger, barrier) is None
    signal(esl, "t3")
    assert granted(ledger, barrier) is not None


def check_a_queue_lets_exactly_the_released_batch_through(b: Backend) -> None:
    """P3: ``release(k)`` lets exactly k wrapper tasks through, in order."""
    ledger = b.ledger
    esl, q = Escher(ledger), Queue("jobs", b.nodes()[0])
    wrappers = [ledger.submit(ResourceRequest(resources=q.requirement, label=f"w{i}")) for i in range(5)]
    q.release(esl, 2)
    through = []
    for w in wrappers:
        p = granted(ledger, w)
        if p is not None:
            q.take(esl)                     # the wrapper consumes its unit, submits the real task, exits
            ledger.release(p.lease_id)
            through.append(w)
    assert through == wrappers[:2]
    assert all(granted(ledger, w) is None for w in wrappers[2:])


def check_gang_is_all_or_none_and_its_rollback_deletes_the_gang_resource(b: Backend) -> None:
    """§4.4e AppSpace: a gang one GPU too big for what is free gets all ghosts but one, times out and rolls
    back (ghosts withdrawn and ended, ``gang-g0`` deleted everywhere); once the blocker ends every ghost runs,
    the members start on the ghosts' nodes, and the gang's end deletes ``gang-g0``. FrameSpace's ``grant_all``
    grants every bundle or none."""
    ledger, nodes = b.ledger, b.nodes()
    esl = Escher(ledger)
    per_node = gpus_per_node(b)
    blocker = grant(ledger, ResourceRequest(gpus=per_node, node=nodes[0], label="blocker"))
    size = per_node * len(nodes) - 1                            # one more GPU than is free
    gang = AppSpaceGang(Gang("g0", tuple(ResourceRequest(gpus=1) for _ in range(size))), timeout=1.0)
    assert ledger.grant_all(list(gang.gang.members)) is None and len(ledger.leases()) == 1
    step = gang.on_arrival(0.0)
    tickets = {i: ledger.submit(gang.gang.ghost(i)) for i in step.submit}
    ghosts = {}
    for i, t in tickets.items():
        p = granted(ledger, t)
        if p is not None:
            ghosts[i] = p
            esl.apply(gang.on_ghost_started(0.1, i, p.node).actions)
    assert len(ghosts) == size - 1 and not gang.done
    assert sum(res.get("gang-g0", (0, 0))[0] for res in ledger.cluster_status().values()) == size - 1
    rollback = gang.on_timer(step.wake_at)
    assert rollback.rollback and rollback.wake_at > step.wake_at
    for t in tickets.values():
        ledger.cancel(t)                                       # the waiting ghost is withdrawn,
    for p in ghosts.values():
        ledger.release(p.lease_id)                             # the running ones end
    esl.apply(rollback.actions)
    assert [p.label for p in ledger.leases()] == ["blocker"]
    assert not any("gang-g0" in res for res in ledger.cluster_status().values())
    ledger.release(blocker.lease_id)
    retry, ghosts, launched = gang.on_retry(rollback.wake_at), {}, ()
    for i in retry.submit:
        p = grant(ledger, gang.gang.ghost(i))
        assert p is not None
        ghosts[i] = p
        s = gang.on_ghost_started(2.0, i, p.node)
        esl.apply(s.actions)
        launched = s.launch or launched
    assert gang.done and gang.attempts == 2 and len(launched) == size
    members = [grant(ledger, m) for m in launched]
    assert sorted(m.node for m in members) == sorted(p.node for p in ghosts.values())
    assert all(m.cpus == 0 and m.fraction == 0 for m in members)   # the ghosts hold the GPUs
    for lease in members + list(ghosts.values()):
        ledger.release(lease.lease_id)
    esl.apply(gang.on_finished(3.0).actions)
    assert not any("gang-g0" in res for res in ledger.cluster_status().values())
    frame = ledger.grant_all([ResourceRequest(gpus=per_node)] * len(nodes))
    assert sorted(p.node for p in frame) == nodes


def check_a_satisfiable_task_eventually_runs(b: Backend) -> None:
    """Strict FIFO never starves: requests of every size up to a node queue behind each other; as leases end
    in grant order, every one of them is granted, a whole node's request included."""
    ledger = b.ledger
    per_node = gpus_per_node(b)
    rng = np.random.default_rng(0)
    sizes = [float(s) for s in rng.choice([0.25, 0.5, 1.0, per_node], size=12)] + [float(per_node)]
    tickets = [ledger.submit(ResourceRequest(gpus=s, label=f"r{i}")) for i, s in enumerate(sizes)]
    held: list[Lease] = []
    done: set[int] = set()
    for _ in range(2 * len(tickets)):
        for t in tickets:
            if t not in done and (p := granted(ledger, t)) is not None:
                done.add(t)
                held.append(p)
        if len(done) == len(tickets) or not held:
            break
        ledger.release(held.pop(0).lease_id)
    assert len(done) == len(tickets)


def check_a_request_no_node_can_hold_waits_off_the_head_under_fifo(b: Backend) -> None:
    """§4.3's "a task whose requirements can be met will eventually be scheduled", under strict FIFO: a barrier
    whose two signals live on different nodes fits no node as configured, so it waits off the head with its own
    timeout and a later request is granted; once both signals are on one node the barrier runs there."""
    ledger, nodes = b.ledger, b.nodes()
    esl = Escher(ledger)
    esl.set_resource("sig-a", 1, nodes[0])
    esl.set_resource("sig-b", 1, nodes[1])
    barrier = ResourceRequest(resources={"sig-a": 1, "sig-b": 1}, label="barrier")
    waiting = ledger.submit(barrier)
    later = grant(ledger, ResourceRequest(gpus=0.5, label="later"))
    assert later is not None and granted(ledger, waiting) is None
    with pytest.raises(AllocationTimeout):                     # queued behind it: its own timeout holds
        ledger.allocate(barrier, timeout=0.3)
    esl.set_resource("sig-b", 1, nodes[0])
    assert granted(ledger, waiting).node == nodes[0]


def check_composition_and_conflict_relaxation(b: Backend) -> None:
    """§4.4h: AND concatenates requirement vectors; an anti-affinity that conflicts is relaxed by the next
    soft preference once the first times out (the ESL cancels the attempt before relaunching)."""
    ledger, nodes = b.ledger, b.nodes()
    esl = Escher(ledger)
    esl.set_resource("fair_a", 10, NodeSpec())
    both = all_of({"fair_a": 1}, anti_affinity(esl, "x"))
    assert both == {"fair_a": 1.0, "anti-x": 1.0}
    placed = [grant(ledger, ResourceRequest(resources=both)) for _ in nodes]
    assert sorted(p.node for p in placed) == nodes
    soft = SoftConstraint([both, {"fair_a": 1}], timeout=1.0)
    first = soft.on_arrival(0.0)
    attempt = ledger.submit(ResourceRequest(resources=first.resources))
    assert first.index == 0 and granted(ledger, attempt) is None
    relaxed = soft.on_timer(1.0)
    ledger.cancel(attempt)
    assert relaxed.index == 1 and grant(ledger, ResourceRequest(resources=relaxed.resources)) is not None
    assert ledger.cluster_status()[nodes[0]]["fair_a"][1] < 10


def check_infeasible_requests_time_out_or_are_cancelled_leaving_nothing_queued(b: Backend) -> None:
    """§4.7: a request for a resource nobody creates waits by design; an ESL gives it a timeout or cancels it,
    and then no ticket or lease of it remains."""
    ledger = b.ledger
    with pytest.raises(AllocationTimeout):
        ledger.allocate(ResourceRequest(gpus=0.5, resources={"never-made": 1}), timeout=0.3)
    cancel = threading.Event()
    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    with pytest.raises(InterruptedError):
        ledger.allocate(ResourceRequest(gpus=0.5, resources={"never-made": 1}), cancel_event=cancel)
    timer.join()
    Escher(ledger).set_resource("never-made", 1, b.nodes()[0])
    # capacity 1: a grant left to a request given up would keep this one waiting past its timeout
    later = ledger.allocate(ResourceRequest(gpus=0.5, resources={"never-made": 1}), timeout=10)
    assert later.node == b.nodes()[0] and over_capacity(ledger) == []
    assert [p.lease_id for p in ledger.leases()] == [later.lease_id] and ledger.waiting() == 0


def check_replay_restores_resources_after_node_loss_and_an_esl_restart(b: Backend, tmp_path) -> None:
    """§4.3 fault tolerance: the ESL's persisted ``set_resource`` log re-creates a lost node's resource on
    another node, survives the ESL's restart, and re-initializes a node that comes back."""
    log = str(tmp_path / f"esl-{b.name}.jsonl")
    nodes = b.nodes()
    esl = Escher(b.ledger, log_path=log)
    esl.set_resource("data-1", 5, nodes[1])
    esl.set_resource("lb", 1, NodeSpec())
    b.lose_node(nodes[1])
    esl = Escher(b.ledger, log_path=log)                         # the ESL restarts: the log is read back
    esl.replay()
    alive = [n for n in nodes if n != nodes[1]]
    status = b.ledger.cluster_status()
    assert sorted(status) == alive
    assert status[nodes[0]]["data-1"] == (5.0, 5.0)               # moved to the first alive node lacking it
    assert all(status[n]["lb"] == (1.0, 1.0) for n in alive)
    assert {(c.name, c.node) for c in Escher(b.ledger, log_path=log).logged()} == \
        {("data-1", nodes[0])} | {("lb", n) for n in nodes}
    b.restore_node(nodes[1])
    Escher(b.ledger, log_path=log).replay()
    status = b.ledger.cluster_status()
    assert status[nodes[1]]["lb"] == (1.0, 1.0) and "data-1" not in status[nodes[1]]
    assert grant(b.ledger, ResourceRequest(resources={"data-1": 1})).node == nodes[0]


SUITE = [
    check_colocated_tasks_land_on_their_partners_node_until_it_is_full,
    check_anti_affine_tasks_run_on_distinct_nodes,
    check_elastic_load_balancing_stays_within_one_task_per_node,
    check_t2_queued_before_t1_runs_after_t1_signals_under_fifo,
    check_a_queue_lets_exactly_the_released_batch_through,
    check_gang_is_all_or_none_and_its_rollback_deletes_the_gang_resource,
    check_a_satisfiable_task_eventually_runs,
    check_a_request_no_node_can_hold_waits_off_the_head_under_fifo,
    check_composition_and_conflict_relaxation,
    check_infeasible_requests_time_out_or_are_cancelled_leaving_nothing_queued,
]
"""Cases taking only a backend; the replay case also takes a folder for the ESL's log."""


@pytest.mark.parametrize("case", SUITE, ids=lambda c: c.__name__[len("check_"):])
def test_escher_suite(backend, case):
    case(backend)


def test_escher_replay_after_node_loss(backend, tmp_path):
    check_replay_restores_resources_after_node_loss_and_an_esl_restart(backend, tmp_path)
