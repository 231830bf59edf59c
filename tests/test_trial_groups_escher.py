"""FLUID trial groups placed by ESCHER (``trial_groups --placement escher``) on a 3-node simulated pool.

One flow run is shared by the flow assertions (a module-scoped fixture): two digit-MLP configs of different
sizes on 3 nodes x 2 simulated GPUs, FLUID free to give a trial up to 5 GPUs (d = 5), two iterations per chunk.
StaticFluid starts them about 3 and 2 GPUs wide (the split follows their measured iteration times): the wider
is wider than a node. One fails (an injected fault) in its second chunk; whether DynamicFluid then widens the
other depends on the beta the gangs measured (1.2-1.3 on a busy 2-core machine), so a resize's migration is
checked on its own flow, one trial at given widths. The planner and the gang grant are also checked on a
real pool ledger without Prefect.
"""

from __future__ import annotations

import os

import pytest
from prefect import flow

from flows.trial_groups import main, trial_groups
from gpu.errors import ConfigError
from gpu.placement import ResourceRequest
from gpu.schedulers.escher.gang import Gang
from gpu.schedulers.escher.trials import plan_trial_nodes, worker_shape
from resource_blocks import GpuPool, MlflowTarget
from tasks.runtime.flow import flow_runner
from tasks.fluid.escher import RENDEZVOUS_TIMEOUT, escher_trials
from tasks.runtime.runners import GpuTaskRunner

GRID = {"lr": 0.1, "hidden": {"grid": [16, 256]}, "batch_size": 64}
FAILING, SURVIVOR = "c0000@0", "c0001@0"


def three_nodes(name: str) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="2x16GiB", nodes=3)


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    """The flow on 3 nodes x 2 GPUs with ESCHER placement, tracked in its own MLflow store."""
    target = MlflowTarget(tracking_uri=f"sqlite:///{tmp_path_factory.mktemp('tge-mlflow')}/mlflow.db",
                          experiment="tg-escher")
    pool = three_nodes("tg-escher")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPUFLOWS_STATE_DIR", str(tmp_path_factory.mktemp("tge-state")))
        s = trial_groups(algorithm="grid", space=GRID, iterations=6, chunk=2, c=2, d=5, alpha=1.5, pool=pool,
                         mode="thread", tracking=target, placement="escher", fail_trial=FAILING,
                         model_name="tg-escher-best", progress=False)
        ledger = pool.open_ledger()
        leftovers = (ledger.leases(), ledger.cluster_status())
    from mlflow import MlflowClient

    return s, MlflowClient(target.resolved_uri()), leftovers


def chunks(summary: dict, trial: str | None = None) -> list[dict]:
    """The trials' chunks (not the gangs that measured scaling), of one trial when given."""
    return [c for c in summary["escher"]["chunks"] if c["purpose"] == "trial" and trial in (None, c["trial"])]


def span(chunk: dict) -> tuple[float, float]:
    return (min(w["started_at"] for w in chunk["workers_ran"]), max(w["finished_at"] for w in chunk["workers_ran"]))


def test_a_trial_wider_than_a_node_runs_as_workers_started_together_on_the_nodes_the_esl_chose(run):
    s = run[0]
    wide = [c for c in s["escher"]["chunks"] if c["workers"] > 2 and not c["failed"]]
    assert wide, chunks(s)
    for c in wide:
        ran = c["workers_ran"]
        assert len(ran) == c["workers"] and sorted(w["rank"] for w in ran) == list(range(c["workers"]))
        per_node: dict[str, int] = {}
        for w in ran:
            per_node[w["node"]] = per_node.get(w["node"], 0) + 1
        assert per_node == c["nodes"], c  # trial-<id>'s capacities put every worker where the ESL said
        assert len(per_node) > 1  # a node has 2 GPUs: the trial spans nodes
        # each worker ran on its ghost's GPU (lease-backed gang unit), a whole distinct device each
        assert sorted((w["node"], tuple(w["devices"])) for w in ran) == \
            sorted((g["node"], tuple(g["devices"])) for g in c["ghosts"])
        assert len({(w["node"], tuple(w["devices"])) for w in ran}) == len(ran)
        latest_start = max(w["started_at"] for w in ran)
        assert all(w["finished_at"] > latest_start for w in ran), ran  # every interval overlaps every other


def test_trials_share_no_node_while_anti_affinity_can_be_met(run):
    s = run[0]
    beside = [c for c in chunks(s) if c["others"]]  # planned while another trial's gang ran
    assert beside, chunks(s)
    for c in beside:  # apart whenever the nodes without the other trial had room for every worker
        assert c["anti_affine"] == (c["room_apart"] >= c["workers"]), c
        assert c["anti_affine"] == (not set(c["nodes"]) & set(c["others"])), c
    done = [c for c in chunks(s) if not c["failed"]]
    for i, a in enumerate(done):
        for b in done[i + 1:]:
            if a["trial"] == b["trial"] or span(a)[1] <= span(b)[0] or span(b)[1] <= span(a)[0]:
                continue
            if set(a["nodes"]) & set(b["nodes"]):  # only when the later plan had no room apart from the other trial
                later = max(a, b, key=lambda c: span(c)[0])
                assert not later["anti_affine"] and later["room_apart"] < later["workers"], (a, b)


def test_every_chunk_resumes_from_the_last_checkpoint_as_a_gang_of_the_width_fluid_gave(run):
    s = run[0]
    for trial, widths in s["widths"].items():
        ran = [c for c in chunks(s, trial)]
        assert [c["width"] for c in ran] == widths  # each of FLUID's widths (resizes included) became one gang
        assert all(c["workers"] == worker_shape(c["width"])[0] for c in ran)
        for before, c in zip(ran, ran[1:]):
            assert c["start"] == before["start"] + before["iterations"] and c["resumed_from_checkpoint"]
            assert c["failed"] or c["resumed_at"] == c["start"]
            assert c["moved"] == (set(c["nodes"]) != set(before["nodes"])) and c["from_nodes"] == before["nodes"]
    assert s["escher"]["migrations"] == sum(c["moved"] for c in chunks(s))
    losses = [p["loss"][0] for p in s["placements"][SURVIVOR]]
    assert losses[-1] < losses[0]  # training went on from the checkpoint, not from fresh weights


@flow(task_runner=GpuTaskRunner(pool=three_nodes("tge-move"), mode="thread", tracking=False))
def resized_trial(folder: str, widths: list[float], failing: int) -> dict:
    """One trial's chunks at the widths DynamicFluid would give, driven like the flow drives them; chunk
    ``failing`` has a worker fail and the next one resumes from the checkpoint the flow had."""
    resources, outs, gone = [], [], []
    with escher_trials("escher", flow_runner()) as escher:
        ckpt, done = f"{folder}/t.pt", 0
        for i, width in enumerate(widths):
            future = escher.submit("t", {"lr": 0.1, "hidden": 32, "batch_size": 64}, done, 1, ckpt if i else None,
                                   ckpt, width, fail=i == failing)
            status = escher.ledger.cluster_status()  # while the gang runs: trial-t where the ESL put it
            resources.append({n: r["trial-t"][0] for n, r in status.items() if "trial-t" in r})
            # the previous gang has fully ended (submit waits for it): its rendezvous folder is gone
            gone.append(not os.path.exists(escher.history[-2]["rendezvous"]) if i else None)
            if i == failing:
                future.wait()
                outs.append(None)
            else:
                outs.append(future.result())
                done += 1
        return {"outs": outs, "chunks": escher.report()["chunks"], "resources": resources, "gone": gone}


@pytest.fixture(scope="module")
def resized(prefect_server, tmp_path_factory):
    """Width 2 fits one node; 4 spans two (the trial moves, trial-t follows); 3 has its worker 2 fail at once;
    back to 2 from the checkpoint the flow had, back to its node."""
    pool = three_nodes("tge-move")
    out = resized_trial(str(tmp_path_factory.mktemp("tge-move")), [2.0, 4.0, 3.0, 2.0], failing=2)
    ledger = pool.open_ledger()
    return out, (ledger.leases(), ledger.cluster_status())


def test_a_resize_boundary_migrates_the_trial_and_training_resumes_from_its_checkpoint(resized):
    out, _ = resized
    ran, outs = out["chunks"], [o for o in out["outs"] if o is not None]
    assert [c["nodes"] for c in ran] == [{"node0": 2}, {"node0": 2, "node1": 2}, {"node0": 2, "node1": 1},
                                         {"node0": 2}]
    assert out["resources"] == [c["nodes"] for c in ran]
    assert [c["moved"] for c in ran] == [False, True, False, True]  # moved: the set of nodes changed
    assert [len(o["workers"]) for o in outs] == [2, 4, 2]
    assert [o["resumed_at"] for o in outs] == [0, 1, 2] and [o["start"] for o in outs] == [0, 1, 2]
    assert outs[1]["loss"][0] < outs[0]["loss"][0] and outs[2]["loss"][0] < outs[1]["loss"][0]
    for o in outs:  # data-parallel: every worker on its own device of the nodes planned
        assert len({(w["node"], tuple(w["devices"])) for w in o["workers"]}) == len(o["workers"])


def test_a_lost_worker_ends_its_peers_at_once_and_the_chunk_fails_leaving_no_lease_or_rendezvous(resized):
    """Worker 2 of a gang across two nodes fails before it joins: the launcher aborts the rendezvous, so workers
    0 and 1 end with GangAborted within seconds instead of the 120 s rendezvous patience."""
    out, (leases, status) = resized
    failed = out["chunks"][2]
    assert [c["failed"] for c in out["chunks"]] == [False, False, True, False] and failed["workers"] == 3
    assert "GangAborted" in failed["failure"] and "injected failure of worker 2" in failed["failure"]
    assert failed["ended_s"] < RENDEZVOUS_TIMEOUT.total_seconds() / 10, failed  # measured: 0.06 s
    assert out["gone"] == [None, True, True, True]
    assert leases == []
    assert not [name for node in status.values() for name in node if name.startswith(("trial-", "gang-"))], status


def test_the_failed_trial_leaks_no_ghost_lease_or_resource(run):
    s, _, (leases, status) = run
    assert s["failures"] == [FAILING] and s["best_trial"] == SURVIVOR
    failed = [c for c in chunks(s, FAILING) if c["failed"]]
    assert failed
    for c in failed:  # its last worker failed; the others, aborted at the rendezvous, ended at once
        assert f"injected failure of worker {c['workers'] - 1}" in c["failure"], c
        assert c["ended_s"] < RENDEZVOUS_TIMEOUT.total_seconds() / 10, c
    assert leases == []
    assert not [name for node in status.values() for name in node if name.startswith(("trial-", "gang-"))], status


def test_mlflow_records_each_workers_node(run):
    s, client, _ = run
    for c in chunks(s, SURVIVOR):
        tags = client.get_run(s["trial_runs"][SURVIVOR]).data.tags
        nodes = sorted(w["node"] for w in c["workers_ran"])
        assert sorted(tags[f"placement.{c['start']:04d}"].split()[0][len("node="):].split(",")) == nodes
    parent = client.get_run(s["mlflow_run_id"])
    runs = client.search_runs([parent.info.experiment_id],
                              f"tags.mlflow.parentRunId = '{s['mlflow_run_id']}'", max_results=500)
    workers = [r for r in runs if r.info.run_name.startswith("fluid-trial-worker")]
    ran = sorted(w["node"] for c in s["escher"]["chunks"] for w in c["workers_ran"])  # scaling gangs too
    assert sorted(r.data.params["node"] for r in workers if r.info.status == "FINISHED") == ran


def test_the_esl_prefers_nodes_without_other_trials_then_one_node_then_the_fewest():
    """``plan_trial_nodes`` on a real ledger's free state: anti-affinity first, then affinity."""
    pool = three_nodes("tge-plan").open_ledger()
    free = pool.free_state()
    plan = plan_trial_nodes("a", 2, 1.0, free, {"node0": {"b"}}, {})
    assert plan.nodes == {"node1": 2} and plan.anti_affine and plan.co_located
    plan = plan_trial_nodes("a", 3, 1.0, free, {"node0": {"b"}}, {})
    assert plan.nodes == {"node1": 2, "node2": 1} and plan.anti_affine and not plan.co_located
    plan = plan_trial_nodes("a", 5, 1.0, free, {"node0": {"b"}}, {"node2": 2})
    assert plan.workers == 5 and not plan.anti_affine  # no room apart from b: anti-affinity relaxed
    assert plan_trial_nodes("a", 7, 1.0, free, {}, {}) is None
    assert plan_trial_nodes("a", 2, 1.0, free, {}, {"node2": 1}).nodes == {"node2": 2}  # stays where it ran


def test_the_gang_is_granted_all_or_none_where_trial_resources_say():
    """The ghosts request ``trial-<id>``: one ledger transaction grants every one on the planned nodes, or none."""
    ledger = three_nodes("tge-gang").open_ledger()
    ledger.set_resource("trial-a", 2, "node1")
    ledger.set_resource("trial-a", 1, "node2")
    gang = Gang("a-0", tuple(ResourceRequest(gpus=1, resources={"trial-a": 1}) for _ in range(3)))
    blocker = ledger.allocate(ResourceRequest(gpus=2, node="node2"))  # node2 full: the third ghost has no room
    assert ledger.grant_all([gang.ghost(i) for i in range(3)]) is None and ledger.leases() == [blocker]
    ledger.release(blocker.lease_id)
    ghosts = ledger.grant_all([gang.ghost(i) for i in range(3)])
    assert sorted(g.node for g in ghosts) == ["node1", "node1", "node2"]
    for g in ghosts:
        ledger.release(g.lease_id)


def test_widths_become_workers():
    assert worker_shape(3.0) == (3, 1.0) and worker_shape(0.5) == (1, 0.5) and worker_shape(1.0) == (1, 1.0)


@pytest.mark.parametrize("kwargs, shown", [
    ({"placement": "nowhere", "pool": three_nodes("tge-bad")}, "nowhere"),
    ({"placement": "escher", "pool": GpuPool(name="tge-one", device_backend="simulated")}, "1 node"),
])
def test_bad_placement_is_refused_before_any_run(kwargs, shown):
    """``.fn``: the flow body without a Prefect run; the check comes before any lease or task."""
    with pytest.raises(ConfigError) as err:
        trial_groups.fn(mode="thread", tracking=False, progress=False, **kwargs)
    assert err.value.field == "placement" and shown in str(err.value)


def test_cli_offers_placement_and_refuses_a_one_node_escher_pool(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--placement" in capsys.readouterr().out
    assert main(["--placement", "escher", "--no-tracking"]) == 2
    assert "placement" in capsys.readouterr().err
    assert main(["--placement", "escher", "--nodes", "0", "--no-tracking"]) == 2
    assert "nodes" in capsys.readouterr().err


