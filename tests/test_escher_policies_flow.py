"""The ESCHER policies flow end to end: real torch tasks through GpuTaskRunner on four simulated nodes, placed
only by set_resource calls and resource requests (gang, affinity, anti-affinity, hierarchical fair sharing)."""

from __future__ import annotations

import pytest

from flows.escher_policies import DEFAULT_POOL, escher_policies, main, prepare
from gpu.errors import ConfigError
from resource_blocks import GpuPool

GOOD = dict(gang_size=2, gang_timeout_s=30.0, team_weights=[1, 1], jobs=2, steps=5, mode="thread", seed=0)


@pytest.mark.parametrize("field, value", [("gang_size", 0), ("gang_size", 5), ("gang_timeout_s", -1.0),
                                          ("team_weights", [1]), ("team_weights", [1, float("nan")]),
                                          ("jobs", 0), ("steps", 2.5), ("mode", "ray")])
def test_bad_input_is_one_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError) as err:
        prepare(DEFAULT_POOL, False, **{**GOOD, field: value})
    assert err.value.field.startswith(field)


def test_a_one_node_pool_and_a_gang_too_wide_for_process_mode_are_refused():
    with pytest.raises(ConfigError, match="pool.nodes"):
        prepare(GpuPool(name="one", device_backend="simulated"), False, **GOOD)
    with pytest.raises(ConfigError, match="gang_size"):
        prepare(DEFAULT_POOL, False, **{**GOOD, "gang_size": 3, "mode": "process"})


@pytest.mark.parametrize("argv, field", [(["--nodes", "1"], "nodes"), (["--gang-size", "0"], "gang_size"),
                                         (["--gang-size", "5"], "gang_size"), (["--mode", "fork"], "mode"),
                                         (["--team-weights", "1", "-2"], "team_weights[1]"),
                                         (["--pool", "a/b"], "pool name")])
def test_a_bad_argument_is_one_line_naming_it_before_any_flow_run(state_dir, capsys, argv, field):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}=") and "\n" not in err


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_the_policies_place_real_tasks_as_the_esls_say(state_dir):
    out = escher_policies(gang_size=3, jobs=2, steps=5, tracking=False)
    nodes = out["nodes"]
    assert nodes == ["node0", "node1", "node2", "node3"]
    placement = out["placement"]
    assert len({r["node"] for r in placement["replicas"]}) == 2                      # anti-affinity
    assert placement["consumer"]["node"] == placement["producer"]["node"]            # affinity (P1)
    assert placement["consumer"]["started"] >= placement["producer"]["started"]

    gang = out["gang"]
    members, ghosts = gang["members"], gang["ghosts"]
    assert len({g["node"] for g in ghosts}) == 3                                     # ghosts spread
    assert sorted((m["node"], tuple(m["devices"])) for m in members) == \
        sorted((g["node"], tuple(g["devices"])) for g in ghosts)                     # on the ghosts' devices
    assert max(m["started"] for m in members) < min(m["ended"] for m in members)     # all ran at once
    assert len({round(m["checksum"], 9) for m in members}) == 1                      # one data-parallel model

    shares, jobs = out["hfs"]["shares"], out["hfs"]["jobs"]
    assert {u: len(n) for u, n in shares.items()} == {"a": 2, "b1": 1, "b2": 1}       # 1:1 teams, 1:1 in B
    assert set(shares["a"]).isdisjoint(shares["b1"] + shares["b2"])
    for job in jobs:
        assert job["node"] in shares[job["user"]]
    assert {row["name"] for row in out["actions"]} >= {"anti-replicas", "anti-gang-ghosts", "gang-dp", "res-a"}
    ledger = GpuPool(name="escher", device_backend="simulated", simulated="1x16GiB", nodes=4).open_ledger()
    assert ledger.leases() == [] and all(set(r) <= {"CPU", "GPU"} for r in ledger.cluster_status().values())


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_gang_whose_ghosts_cannot_all_start_rolls_back_and_starts_once_they_can(state_dir):
    """AppSpace (§4.4e): node3's GPU is busy for ~1.5 s, so the first attempts time out (0.5 s), roll back
    their ghosts (no lease kept) and back off; once the GPU is free the whole gang starts, one member per node."""
    import threading

    from prefect import flow

    from flows.escher_policies import run_gang
    from gpu.placement import ResourceRequest
    from gpu.schedulers.escher.api import Escher
    from tasks.runners import GpuTaskRunner

    pool = GpuPool(name="escher-rollback", device_backend="simulated", simulated="1x16GiB", nodes=4)
    runner = GpuTaskRunner(pool=pool, mode="thread", tracking=False)

    @flow(task_runner=runner)
    def gang_flow():
        ledger = runner.ledger()
        busy = ledger.allocate(ResourceRequest(gpus=1, node="node3", label="busy"), timeout=1)
        threading.Timer(1.5, ledger.release, (busy.lease_id,)).start()
        return run_gang(ledger, Escher(ledger), size=4, steps=3, timeout_s=0.5, seed=0)

    gang = gang_flow()
    assert gang["attempts"] >= 2 and gang["gang_latency_s"] >= 1.0  # the busy GPU was freed 1.5 s in
    assert sorted(m["node"] for m in gang["members"]) == ["node0", "node1", "node2", "node3"]
    assert max(m["started"] for m in gang["members"]) < min(m["ended"] for m in gang["members"])
    ledger = pool.open_ledger()
    assert ledger.leases() == [] and all(set(r) <= {"CPU", "GPU"} for r in ledger.cluster_status().values())
