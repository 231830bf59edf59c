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
from tasks.requests import TaskPlacement, placed, set_resource


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
from tasks.requests import TaskPlacement, placed, set_resource
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


def test_a_dead_ghosts_resource_is_reclaimed_with_its_lease_so_its_gang_cannot_start():
    """A ghost whose holder died loses its lease at the next reclaim, and ``gang-g`` goes with it: the
    member waiting for it keeps waiting (the gang's timeout rolls it back) instead of running unbacked."""
    import subprocess as sp

    from gpu.liveness import HOST, Owner

    dead = sp.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ledger = three_nodes()
    ghost_owner = Owner(HOST, dead.pid, 1, "ghost")
    _, ghost = ledger.submit_and_try(ResourceRequest(gpus=1, node="node0"), owner=ghost_owner)
    ledger.lease_resource(ghost.lease_id, "gang-g", 1)
    member = ledger.submit(ResourceRequest(resources={"gang-g": 1}))
    assert ledger.try_grant(member) is not None                          # granted while the ghost lived
    with ledger._tx("reclaim now") as db:
        assert ledger._reclaim(db, force=True) == 1
    assert "gang-g" not in ledger.cluster_status()["node0"]
    assert ledger.try_grant(ledger.submit(ResourceRequest(resources={"gang-g": 1}))) is None
