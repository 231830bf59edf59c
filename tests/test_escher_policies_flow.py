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
    assert main(["--nodes", "1"]) != 0


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
