"""ESCHER's simulator: the paper's evaluation shapes (thesis §4.6) from real ESL calls on a small scale."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.sim.escher.affinity import Affinity, affinity_placements
from gpu.sim.escher.run import EXPERIMENTS, run
from gpu.sim.escher.gangs import GangLoad, GangWorld
from gpu.sim.escher.workloads import (
    FairShare, Tune, WordCount, bandwidth, fair_share, link_bandwidth, tune, wordcount,
)
from gpu.sim.escher.world import Timing
from gpuflows.cli import main

T = Timing()


def test_gang_designs_order_as_in_fig_4_7():
    """FrameSpace fastest on average, LibSpace's minimum the highest, every gang all-or-none and < 1 s."""
    load = GangLoad(gangs=40, arrival_rate=10.0)
    worlds = {d: GangWorld(d, load, T, seed=3) for d in ("appspace", "libspace", "framespace")}
    lat = {d: np.array(w.run()) for d, w in worlds.items()}
    assert all(len(v) == 40 for v in lat.values())
    assert lat["framespace"].mean() < 0.75 * min(lat["appspace"].mean(), lat["libspace"].mean())
    assert lat["libspace"].min() > lat["appspace"].min() > lat["framespace"].min()
    assert max(v.max() for v in lat.values()) < 1.0
    for w in worlds.values():                                        # every gang's resource deleted, no lease left
        assert w.world.ledger.leases() == []
        assert not any(k.startswith("gang-g") for res in w.world.ledger.cluster_status().values() for k in res)


def test_appspace_rolls_back_deadlocked_gangs_and_retries():
    """Two gangs that each need most of the cluster deadlock on their ghosts; timeouts break it."""
    load = GangLoad(nodes=2, cpus=8, gangs=20, sizes=(12,), arrival_rate=200.0, run_s=0.05, timeout=0.05)
    world = GangWorld("appspace", load, T, seed=1)
    lat = world.run()
    assert len(lat) == 20
    assert max(r.attempt for r in world.runs) >= 1                    # at least one rollback happened
    assert world.world.ledger.leases() == [] and world.world.ledger.waiting() == 0


def test_wordcount_locality_matches_native_with_a_calibrated_or_a_measured_bandwidth():
    load = WordCount(nodes=20)
    bw = bandwidth(load, 20)
    random = wordcount(load, "random", 500, 20, bw, T, 0)
    native = wordcount(load, "native", 500, 20, bw, T, 0)
    escher = wordcount(load, "escher", 500, 20, bw, T, 0)
    assert escher["transfer_share"] == native["transfer_share"] == 0.0
    assert escher["makespan_s"] / native["makespan_s"] - 1 < 0.019
    assert 0.5 < random["transfer_share"] < 0.65 and random["makespan_s"] > 2 * native["makespan_s"]
    measured = WordCount(nodes=20, compute_s_per_gb=20.0, bandwidth_gb_s=2.8)    # rates as measured on one machine
    assert link_bandwidth(measured, 20) == 2.8 and link_bandwidth(load, 20) == bw
    local = wordcount(measured, "random", 500, 20, 2.8, T, 0)["transfer_share"]
    per_gb = 1 / 2.8                                                          # s to move a GB, beside 20 s to count it
    assert 0 < local <= per_gb / (per_gb + 20.0) + 1e-12


def test_hfs_shares_follow_fig_4_5c_with_the_dip_at_60():
    samples = fair_share(FairShare(nodes=20, horizon_s=180), T, 0)
    at = {s["t"]: s for s in samples}
    assert (at[55]["A"], at[55]["B"]) == (20, 0)
    assert (at[115]["A"], at[115]["B"]) == (8, 12)
    assert (at[175]["A"], at[175]["B"], at[175]["C"]) == (4, 6, 10)
    assert min(s["net_throughput"] for s in samples if 60 <= s["t"] <= 90) < 0.9   # B warms up
    assert min(s["net_throughput"] for s in samples if 120 <= s["t"] <= 150) > 0.95  # B keeps its warm nodes


def test_eschertune_migrates_the_spread_job_onto_one_node():
    static, moved = tune(Tune(), False, T, 0), tune(Tune(), True, T, 0)
    assert static["long_nodes_at_end"] > 1 and static["migrated_at_s"] < 0
    assert moved["long_nodes_at_end"] == 1 and 120 <= moved["migrated_at_s"] <= 130   # after the first short job
    assert moved["final_rate"] / static["final_rate"] == pytest.approx(1.363)
    assert moved["long_work"] > static["long_work"]


def test_affinity_puts_replicas_apart_and_consumers_beside_their_producers():
    """Table 4.2 (P3, P1): with the ESL calls every replica has a node of its own and every consumer runs on its
    producer's node (waiting for room there when best fit filled it); the scheduler alone packs the replicas and
    scatters the consumers. Every resource is deleted and every lease released at the end."""
    load = Affinity(nodes=4, cpus=8, replicas=3, pairs=6, task_s=1.0)
    escher, none = (affinity_placements(load, p, T, 0) for p in ("escher", "none"))
    assert (escher["replica_spread"], escher["colocated_share"]) == (1.0, 1.0)
    assert none["replica_spread"] < 1.0 and none["colocated_share"] < 1.0
    assert escher["consumer_delay_ms"] >= 1e3 * T.set_resource             # behind the producer's set_resource
    assert escher["finished"] == none["finished"] == 1.0
    assert escher["left_on_ledger"] == none["left_on_ledger"] == 0.0


def test_the_simulator_the_flow_and_the_policy_block_name_the_same_policies():
    from tasks.escher.demos import DEMOS
    from gpu.schedulers.escher.policies import POLICIES
    from resource_blocks import SchedulerPolicy

    assert set(EXPERIMENTS) == set(DEMOS) == set(POLICIES)
    for name in POLICIES:
        assert SchedulerPolicy(system="escher", policy=name).policy == name


SMALL = {"name": "small", "seed": 0, "policies": ["locality", "colocation", "tune"],
         "locality": {"nodes": 10, "input_gb": [10, 50], "cluster_sizes": [5, 10]},
         "colocation": {"nodes": 4, "pairs": 8, "explorations": 50}}


def test_cli_simulates_escher_and_writes_flat_figures(tmp_path, capsys):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps(SMALL))
    out = tmp_path / "out.json"
    assert main(["simulate", "escher", str(scenario), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["colocation_escher_colocated_share"] == 1.0
    assert summary["colocation_ephemeral_overhead_pct"] == pytest.approx(0.0)
    assert summary["locality_escher_vs_native_max_gap_pct"] < 1.9
    assert "36.3 (calibrated: " in capsys.readouterr().out


@pytest.mark.parametrize("patch, field", [
    ({"policies": ["nope"]}, "policy"),
    ({"locality": {"nodes": 0}}, "locality.nodes"),
    ({"locality": {"bandwidth_gb_s": 0}}, "locality.bandwidth_gb_s"),
    ({"colocation": {"pairs": 100, "nodes": 2}}, "colocation.pairs"),
    ({"tune": {"long_gpus": 8}}, "tune.long_gpus"),
    ({"gang": {"sizes": [100]}}, "gang.sizes"),
    ({"affinity": {"replicas": 9, "nodes": 8}}, "affinity.replicas"),
    ({"hfs": {"users": []}}, "hfs.users"),
    ({"timing": {"set_resource_s": -1}}, "timing.set_resource_s"),
    ({"typo": 1}, "typo"),
])
def test_bad_scenarios_fail_before_any_work(tmp_path, patch, field):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps({**SMALL, **patch}))
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        run(str(scenario), ["affinity", "gang", "hfs", "tune", "locality", "colocation"] if "policies" not in patch else None)
