"""The ledger's resource API that ESCHER's libraries run on: set, atomic adjust, cluster status,
several simulated nodes, and a task reaching its own pool to create a resource on its own node."""

from __future__ import annotations

import math
import subprocess
import sys
import threading

import pytest

from gpu.devices import simulated_nodes
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger, open_ledger
from gpu.placement import ResourceRequest
from tasks.runtime.requests import TaskPlacement, placed
from tasks.runtime.task_ledger import set_resource


def three_nodes(path=None) -> PoolLedger:
    return PoolLedger(simulated_nodes("2x16GiB", 3, cpus=4), path)


def test_a_local_pool_can_have_several_simulated_nodes():
    ledger = three_nodes()
    assert [n.name for n in ledger.free_state()] == ["node0", "node1", "node2"]
    placed_on = {ledger.allocate(ResourceRequest(gpus=1, cpus=4)).node for _ in range(3)}
    assert placed_on == {"node0", "node1", "node2"}          # each node's 4 CPUs hold one such task


def test_bad_node_counts_are_config_errors():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="nodes="):
            simulated_nodes("1x16GiB", bad)


def test_cluster_status_lists_every_node_with_physical_and_ephemeral_availability():
    ledger = three_nodes()
    ledger.set_resource("load_bal", 1)
    ledger.set_resource("data-7", 5, "node1")
    ledger.allocate(ResourceRequest(cpus=1, resources={"data-7": 2}))
    status = ledger.cluster_status()
    assert set(status) == {"node0", "node1", "node2"}
    assert status["node1"]["data-7"] == (5.0, 3.0)
    assert status["node1"]["CPU"] == (4.0, 3.0)
    assert status["node0"]["GPU"] == (2.0, 2.0)
    assert all(status[n]["load_bal"] == (1.0, 1.0) for n in status)
    assert "data-7" not in status["node0"]


def test_adjust_resource_is_atomic_across_processes_sharing_a_pool_file(tmp_path):
    """Two ledgers on one file, 4 threads each adding 1 fifty times: no update is lost (ESCHER §4.5 delta log)."""
    path = tmp_path / "pool.sqlite"
    ledgers = [three_nodes(path), three_nodes(path)]
    threads = [threading.Thread(target=lambda lg=lg: [lg.adjust_resource("L", 1, "node0") for _ in range(50)])
               for lg in ledgers for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert ledgers[0].cluster_status()["node0"]["L"] == (200.0, 200.0)
    assert ledgers[1].adjust_resource("L", -200, "node0") == {"node0": 0.0}
    assert "L" not in ledgers[0].cluster_status()["node0"]               # capacity 0: deleted


def test_adjust_resource_grants_a_waiting_request_and_rejects_bad_deltas():
    ledger = three_nodes()
    waiting = ledger.submit(ResourceRequest(resources={"queue": 1}))
    assert ledger.try_grant(waiting) is None
    ledger.adjust_resource("queue", 1, "node2")
    assert ledger.try_grant(waiting).node == "node2"
    for bad in (math.nan, math.inf, "1", None):
        with pytest.raises(ConfigError, match="delta"):
            ledger.adjust_resource("queue", bad, "node2")
    with pytest.raises(ConfigError, match="node="):
        ledger.adjust_resource("queue", 1, "node9")


def test_a_placement_names_its_pool_and_a_task_sets_a_resource_on_its_own_node():
    ledger = three_nodes()
    ledger.allocate(ResourceRequest(cpus=4), timeout=1)                          # node0 full: the task lands elsewhere
    placement = ledger.allocate(ResourceRequest(cpus=1, label="t1"), timeout=1)
    assert placement.pool == ledger.pool_id
    with placed(TaskPlacement(placement, "cpu", "")):
        set_resource("coloc-t1", 1)                                      # None: the task's node (P1)
    assert {n for n, res in ledger.cluster_status().items() if "coloc-t1" in res} == {placement.node}
    partner = ledger.allocate(ResourceRequest(resources={"coloc-t1": 1}), timeout=1)
    assert partner.node == placement.node


_WORKER = """
import json, sys
from gpu.ledger import Lease
from tasks.runtime.requests import TaskPlacement, placed
from tasks.runtime.task_ledger import set_resource
with placed(TaskPlacement(Lease.from_dict(json.loads(sys.argv[1])), "cpu", "")):
    set_resource("data-0", 3)
"""


def test_a_task_in_another_process_reaches_its_pool_through_the_placement(tmp_path):
    import json

    ledger = three_nodes(tmp_path / "pool.sqlite")
    ledger.allocate(ResourceRequest(cpus=4), timeout=1)
    placement = ledger.allocate(ResourceRequest(cpus=1), timeout=1)
    subprocess.run([sys.executable, "-c", _WORKER, json.dumps(placement.to_dict())], check=True, timeout=60)
    assert ledger.cluster_status()[placement.node]["data-0"] == (3.0, 3.0)
    assert open_ledger(ledger.pool_id) is ledger                          # this process: the open one


def test_open_ledger_refuses_unknown_pools():
    with pytest.raises(ConfigError, match="pool="):
        open_ledger("memory:nope")


def test_a_gpu_ghost_lends_its_devices_to_the_tasks_of_its_resource_and_takes_the_resource_with_it(tmp_path):
    """ESCHER's gang ghost on GPUs: the member asks only for ``gang-g`` yet runs on the ghost's GPU."""
    ledger = three_nodes(tmp_path / "pool.sqlite")
    ghost = ledger.allocate(ResourceRequest(gpus=1, node="node1", label="ghost"), timeout=1)
    ledger.lease_resource(ghost.lease_id, "gang-g", 2)
    members = [ledger.allocate(ResourceRequest(resources={"gang-g": 1}, label=f"m{i}"), timeout=1) for i in range(2)]
    assert {(m.node, m.devices, m.cuda_visible_devices) for m in members} == {("node1", ghost.devices,
                                                                                ghost.cuda_visible_devices)}
    node1 = next(n for n in ledger.free_state() if n.name == "node1")
    used = [d.index for d in node1.devices if d.compute_free < 1]
    assert used == list(ghost.devices)                                   # counted once, for the ghost
    assert ledger.allocate(ResourceRequest(gpus=1, node="node1"), timeout=1).devices != ghost.devices
    ledger.release(ghost.lease_id)
    assert "gang-g" not in ledger.cluster_status()["node1"]             # dies with the lease
    from gpu.errors import LeaseLost

    with pytest.raises(LeaseLost):
        ledger.lease_resource(ghost.lease_id, "gang-g", 1)


_GHOST = """
import sys
from gpu.devices import simulated_nodes
from gpu.ledger import PoolLedger
from gpu.placement import ResourceRequest
ledger = PoolLedger(simulated_nodes("2x16GiB", 3, cpus=4), sys.argv[1])
ghost = ledger.allocate(ResourceRequest(gpus=1, node=sys.argv[2], label="ghost"), timeout=30)
ledger.lease_resource(ghost.lease_id, sys.argv[3], 1)      # its unit of gang-<g>, backed by its GPU (P4)
print(ghost.lease_id, ghost.devices[0], flush=True)
sys.stdin.read()                                           # runs until the ESL ends it
ledger.release(ghost.lease_id)
"""


@pytest.mark.slow  # real processes under a fault
def test_a_ghost_killed_mid_gang_loses_its_lease_and_its_gang_rolls_back_then_runs(tmp_path):
    """ESCHER §4.4e under a fault: two of a gang's three GPU ghosts run in their own processes, the third
    waits; kill -9 of one ghost frees its GPU and its ``gang-g`` unit (its process is dead), the ESL rolls the
    gang back (ghosts ended or withdrawn, ``gang-g`` deleted everywhere), and the retry runs all members."""
    from gpu.schedulers.escher.api import Escher
    from gpu.schedulers.escher.gang import AppSpaceGang, Gang
    from gpu.schedulers.escher.primitives import anti_affinity

    path = tmp_path / "pool.sqlite"
    ledger = three_nodes(path)
    esl = Escher(ledger)
    blocker = ledger.allocate(ResourceRequest(gpus=2, node="node2", label="blocker"), timeout=1)
    spread = anti_affinity(esl, "ghosts")                    # one ghost per node, as the flow spreads them
    gang = AppSpaceGang(Gang("g", tuple(ResourceRequest(gpus=1, resources=spread) for _ in range(3))), timeout=30)
    assert gang.on_arrival(0.0).submit == (0, 1, 2)
    ghosts = {}
    for i, node in ((0, "node0"), (1, "node1")):
        proc = subprocess.Popen([sys.executable, "-c", _GHOST, str(path), node, gang.gang.resource],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        lease_id, device = proc.stdout.readline().split()
        ghosts[i] = (proc, lease_id, int(device))
        assert not gang.on_ghost_started(0.1, i, node).launch
    third = ledger.submit(ResourceRequest(gpus=1, node="node2", label="ghost"))       # node2 is busy: it waits
    assert {n: r["gang-g"] for n, r in ledger.cluster_status().items() if "gang-g" in r} == \
        {"node0": (1.0, 1.0), "node1": (1.0, 1.0)}

    killed, lease_id, device = ghosts.pop(1)
    killed.kill()
    killed.wait()
    # its GPU is granted again (ahead of the waiting ghost): the dead holder was reclaimed
    probe = ledger.allocate(ResourceRequest(gpus=1, node="node1", devices=(device,)), timeout=5, priority=1)
    ledger.release(probe.lease_id)
    reclaimed = [e for e in ledger.events() if e["lease_id"] == lease_id and e["kind"] == "reclaim"]
    assert len(reclaimed) == 1 and "died" in reclaimed[0]["reason"]
    assert "gang-g" not in ledger.cluster_status()["node1"]                               # the unit died with it

    rollback = gang.on_ghost_lost(1.0, 1)
    assert rollback.rollback and rollback.wake_at > 1.0 and not gang.done
    ledger.cancel(third)                                      # the waiting ghost is withdrawn,
    survivor = ghosts[0][0]
    survivor.communicate("", timeout=60)                      # the running one ends
    esl.apply(rollback.actions)
    assert [p.label for p in ledger.leases()] == ["blocker"] and ledger.waiting() == 0
    assert not any("gang-g" in r for r in ledger.cluster_status().values())

    ledger.release(blocker.lease_id)
    retry, launched, placed = gang.on_retry(rollback.wake_at), (), {}
    for i in retry.submit:
        ghost = ledger.allocate(gang.gang.ghost(i), timeout=5)
        ledger.lease_resource(ghost.lease_id, gang.gang.resource, 1)
        placed[ghost.node] = ghost
        launched = gang.on_ghost_started(2.0, i, ghost.node).launch or launched
    assert gang.done and gang.attempts == 2 and len(launched) == 3 and len(placed) == 3
    members = [ledger.allocate(m, timeout=5) for m in launched]
    assert sorted((m.node, m.devices) for m in members) == sorted((g.node, g.devices) for g in placed.values())
