"""The ESCHER policies flow end to end: real torch and data tasks through GpuTaskRunner on four simulated nodes,
placed only by set_resource calls and resource requests (affinity, anti-affinity, gang, hierarchical fair sharing,
WordCount locality, AlphaZero co-location, EscherTune migration)."""

from __future__ import annotations

import collections
import os

import pytest

from flows.escher_policies import DEFAULT_POOL, POLICIES, escher_policies, main, prepare
from gpu.errors import ConfigError
from resource_blocks import GpuPool, SchedulerPolicy
from tasks.runtime.runners import GpuTaskRunner
from tasks.escher.jobs import shard_text
from gpu.schedulers.escher.effort import source_lines

GOOD = dict(gang_size=2, gang_timeout_s=30.0, team_weights=[1, 1], jobs=2, steps=5, mode="thread", seed=0,
            shards=4, words=500, reducers=2, pairs=2, rounds=3)


def _pool_is_clean(name: str) -> bool:
    ledger = GpuPool(name=name, device_backend="simulated", simulated="1x16GiB", nodes=4).open_ledger()
    return ledger.leases() == [] and all(set(r) <= {"CPU", "GPU"} for r in ledger.cluster_status().values())


@pytest.mark.parametrize("field, value", [("gang_size", 0), ("gang_size", 5), ("gang_timeout_s", -1.0),
                                          ("team_weights", [1]), ("team_weights", [1, float("nan")]),
                                          ("jobs", 0), ("steps", 2.5), ("mode", "ray"), ("shards", 0),
                                          ("words", -3), ("reducers", 0), ("pairs", 5), ("rounds", 0),
                                          ("policies", ["wordcount"]), ("policies", []), ("policies", "gang")])
def test_bad_input_is_one_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError) as err:
        prepare(DEFAULT_POOL, False, **{**GOOD, field: value})
    assert err.value.field.startswith(field)


@pytest.mark.parametrize("policy, field", [
    (SchedulerPolicy(system="ekya", policy="thief"), "policy.system"),
    (SchedulerPolicy(system="escher", policy="gang", params={"width": 3}), "policy.params"),
    ({"system": "escher", "policy": "no-such-policy"}, "policy"),
])
def test_a_scheduler_policy_the_flow_cannot_run_is_refused(policy, field):
    with pytest.raises(ConfigError) as err:
        prepare(DEFAULT_POOL, False, **GOOD, policy=policy)
    assert err.value.field == field


def test_a_scheduler_policy_picks_one_demo_and_sets_its_parameters():
    _, _, chosen, settings = prepare(DEFAULT_POOL, False, **GOOD, policy=SchedulerPolicy(
        system="escher", policy="locality", params={"shards": 3, "reducers": 1}))
    assert chosen == ("locality",) and (settings.shards, settings.reducers, settings.words) == (3, 1, 500)
    assert prepare(DEFAULT_POOL, False, **GOOD, policy={"system": "escher", "policy": "affinity"})[2] == ("affinity",)
    _, _, chosen, _ = prepare(DEFAULT_POOL, False, **GOOD, policies=["tune", "gang", "tune"])
    assert chosen == ("tune", "gang")
    assert prepare(DEFAULT_POOL, False, **GOOD)[2] == POLICIES


def test_a_one_node_pool_is_refused_and_process_mode_takes_a_gang_as_wide_as_the_pool():
    with pytest.raises(ConfigError, match="pool.nodes"):
        prepare(GpuPool(name="one", device_backend="simulated"), False, **GOOD)
    assert prepare(DEFAULT_POOL, False, **{**GOOD, "gang_size": 4, "mode": "process"})[3].gang_size == 4


def test_lines_of_code_count_the_esl_without_its_docstring():
    def esl(esl, data_id):
        """A docstring is not code."""
        # nor is a comment
        esl.set_resource(f"data-{data_id}", 1)

        return {f"data-{data_id}": 1}

    assert source_lines(esl) == 3


@pytest.mark.parametrize("argv, field", [(["--nodes", "1"], "nodes"), (["--gang-size", "0"], "gang_size"),
                                         (["--gang-size", "5"], "gang_size"), (["--mode", "fork"], "mode"),
                                         (["--team-weights", "1", "-2"], "team_weights[1]"),
                                         (["--pool", "a/b"], "pool name"), (["--policy", "mapreduce"], "policies"),
                                         (["--pairs", "9"], "pairs")])
def test_a_bad_argument_is_one_line_naming_it_before_any_flow_run(state_dir, capsys, argv, field):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}=") and "\n" not in err


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_the_policies_place_real_tasks_as_the_esls_say(state_dir):
    out = escher_policies(gang_size=3, jobs=2, steps=5, shards=6, words=2000, rounds=4, tracking=False)
    assert out["nodes"] == ["node0", "node1", "node2", "node3"] and out["policies"] == list(POLICIES)
    placement = out["affinity"]
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

    shares, jobs, timeline = out["hfs"]["shares"], out["hfs"]["jobs"], out["hfs"]["timeline"]
    assert {u: len(n) for u, n in shares.items()} == {"a": 2, "b1": 1, "b2": 1}       # 1:1 teams, 1:1 in B
    assert set(shares["a"]).isdisjoint(shares["b1"] + shares["b2"])
    for row in timeline:                                                              # never a node twice
        held = [n for nodes in row["shares"].values() for n in nodes]
        assert len(held) == len(set(held))
    for job in jobs:                                                                  # only on its user's nodes
        assert any(job["node"] in row["shares"][job["user"]] for row in timeline)
    assert timeline[-1]["shares"] == {"a": [], "b1": [], "b2": []}                    # every share given back

    # WordCount (Fig. 4.5a): the same counts as one Counter over the whole text; locality moves nothing
    whole = collections.Counter(" ".join(shard_text(i, 2000, 0) for i in range(6)).split())
    plain, local = out["locality"]["no_locality"], out["locality"]["locality"]
    assert plain["counts"] == local["counts"] == dict(whole)
    assert local["transfer_bytes"] == 0 and all(m["node"] == m["source"] for m in local["maps"])
    assert plain["transfer_bytes"] == sum(m["input_bytes"] for m in plain["maps"] if m["node"] != m["source"]) > 0

    # AlphaZero (Fig. 4.6a): predictors one per node, each aggregator on its predictor's node
    pairs = out["colocation"]["pairs"]
    assert len({p["predictor"]["node"] for p in pairs}) == len(pairs) == 2
    assert all(p["aggregator"]["node"] == p["predictor"]["node"] for p in pairs)
    assert all(len(p["aggregator"]["moves"]) == 4 for p in pairs)

    # EscherTune (Fig. 4.6c): the trial started spread beside the short jobs, was consolidated onto the node a short
    # job left room on once measured, and its relaunched workers went on from the checkpoint there
    tune = out["tune"]
    spread, moved = tune["launches"]
    assert {r["node"] for r in spread} == {"node0", "node1"} and len({r["node"] for r in moved}) == 1
    (move,) = tune["moves"]
    assert move["from"] == {"node0": 1, "node1": 1} and list(move["to"].values()) == [2]
    assert move["remaining_s"] > move["launch_s"] > 0 and move["rate"] > 0
    short_end = {r["node"]: r["ended"] for r in tune["short_jobs"]}[moved[0]["node"]]
    assert short_end <= max(r["ended"] for r in spread)                 # room appeared before the workers stopped
    assert all(r["last_step"] == spread[0]["last_step"] for r in spread)  # the workers stopped at the same step
    assert 0 < moved[0]["first_step"] == spread[0]["last_step"] < moved[0]["last_step"] == 500
    assert moved[0]["losses"][0] == pytest.approx(spread[0]["final_loss"], rel=1e-5)
    assert moved[0]["final_loss"] < spread[0]["final_loss"] < spread[0]["losses"][0]
    assert len({round(r["checksum"], 9) for r in moved}) == 1          # one data-parallel model

    names = {row["name"] for row in out["actions"]}
    assert names >= {"anti-replicas", "anti-gang-ghosts", "gang-dp", "res-a", "data-shard-0", "anti-predictors",
                     "coloc-predictor-0", "trial-long"}
    assert _pool_is_clean("escher")


HEAVIER = 100
"""How much heavier user b1's SGD is in the heavier-work test: each step runs over the digits this many times."""


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_user_whose_jobs_are_heavier_is_handed_the_nodes_the_others_leave_idle(state_dir, monkeypatch):
    """Fig. 4.5c's max-min sharing driven by measured work: user b1's jobs train on 100x the data per step (same
    flow settings), so once a's and b2's light jobs end, the monitor's next periods hand their idle nodes to b1,
    whose second job then runs beside its first on a node that was a's. With shares fixed at the start, b1's
    jobs would run one after the other on its one node."""
    import time

    import torch
    from prefect import task

    import tasks.escher.fair_share
    from tasks.escher.jobs import digits, linear_model, team_job, where

    @task
    def heavier_for_b1(user: str, i: int, steps: int) -> dict:
        if user != "b1":
            return team_job.fn(user, i, steps)
        started = time.time()
        x, y = digits()
        x, y = x.repeat(HEAVIER, 1), y.repeat(HEAVIER)
        model = linear_model(4 + i)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return {"task": f"{user}-{i}", "user": user, **where(started)}

    digits()  # the digits loaded and torch imported before the flow: every job's time is its own work
    monkeypatch.setattr(tasks.escher.fair_share, "team_job", heavier_for_b1)
    out = escher_policies(policies=["hfs"], jobs=2, steps=30, tracking=False)["hfs"]
    first, second = sorted((j for j in out["jobs"] if j["user"] == "b1"), key=lambda j: j["started"])
    assert out["shares"]["b1"] == [first["node"]]                                     # b1 starts on its one node
    assert second["node"] in out["shares"]["a"]                                       # then is handed one of a's
    assert second["started"] < first["ended"]                                         # while its first job runs
    a_done = max(j["ended"] for j in out["jobs"] if j["user"] == "a")
    assert first["ended"] > a_done                                                    # the heavy work was longer
    handed = [row for row in out["timeline"] if row["demand"].get("a") == 0 and row["demand"].get("b1", 0) >= 2]
    assert handed and all(row["shares"]["a"] == [] and len(row["shares"]["b1"]) >= 2 for row in handed)
    assert out["metrics"]["peak_share_b1_nodes"] >= 2
    assert _pool_is_clean("escher")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_gang_of_three_runs_at_once_in_process_mode(state_dir):
    """Every simulated node's GPU is device 0, so the members share one process pool: the flow sizes it to the
    gang. Each member is its own process; the gloo all-reduce only completes with all three running."""
    out = escher_policies(policies=["gang"], gang_size=3, steps=5, mode="process", tracking=False)
    members = out["gang"]["members"]
    assert len({m["node"] for m in members}) == 3
    assert max(m["started"] for m in members) < min(m["ended"] for m in members)
    assert len({round(m["checksum"], 9) for m in members}) == 1                      # one data-parallel model
    assert _pool_is_clean("escher")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_scheduler_policy_runs_its_demo_and_mlflow_keeps_a_run_per_policy(state_dir):
    from mlflow import MlflowClient

    from tasks.runtime.tracking import default_tracking_uri

    block = SchedulerPolicy(system="escher", policy="tune", params={"steps": 4})
    out = escher_policies(policy=block)
    assert out["policies"] == ["tune"] and out["mlflow_errors"] == []
    assert out["tune"]["after"]["last_step"] == 400                   # the trial is 100 x steps long
    client = MlflowClient(default_tracking_uri())
    runs = client.search_runs([client.get_experiment_by_name("gpuflows-escher").experiment_id],
                              "tags.`escher.policy` = 'tune'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "eschertune" and run.data.tags["mlflow.parentRunId"]
    first = out["tune"]["before"]
    assert run.data.params[f"node.{first['task']}"] == first["node"]
    assert run.data.params["paper_lines"] == "50" and run.data.metrics["esl_lines"] == out["tune"]["esl_lines"]
    assert run.data.metrics["moves"] == len(out["tune"]["moves"])
    logged = client.download_artifacts(run.info.run_id, "set_resource.json", str(state_dir))
    import json

    calls = json.load(open(logged))
    assert {(c["node"], c["capacity"]) for c in calls if c["name"] == "lb-short" and c["capacity"] > 0} == {
        (f"node{i}", 1.0) for i in range(4)}                              # one short job per node leaves one room
    assert [(c["node"], c["capacity"]) for c in calls if c["name"] == "trial-long" and c["capacity"] > 0] == [
        (n, float(w)) for placement in out["tune"]["placements"] for n, w in placement.items()]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_gang_rolls_back_until_its_ghosts_all_start_and_a_crashed_member_ends_its_peers_at_once(
        state_dir, tmp_path, monkeypatch):
    """AppSpace (§4.4e): node3's GPU is busy for ~1 s, so the first attempts time out (0.3 s), roll back their
    ghosts (no lease kept) and back off; once the GPU is free the whole gang starts, one member per node.
    Then a gang whose member 1 crashes after one all-reduce: its peer ends at once instead of after the
    rendezvous timeout, the gang fails, and neither ``gang-dp`` nor any lease is left on the pool."""
    import threading
    import time

    from prefect import flow

    import tasks.escher.gang
    from gpu.placement import ResourceRequest
    from gpu.schedulers.escher.api import Escher
    from tasks.escher.gang import run_gang
    from tasks.escher.jobs import RENDEZVOUS_TIMEOUT, train

    pool = GpuPool(name="escher-rollback", device_backend="simulated", simulated="1x16GiB", nodes=4)
    runner = GpuTaskRunner(pool=pool, mode="thread", tracking=False)

    def crashing_train(model, steps, shard, shards, average):
        if shard == 1:
            train(model, 1, shard, shards, average)
            raise RuntimeError("member 1 crashed")
        return train(model, steps, shard, shards, average)

    @flow(task_runner=runner)
    def gang_flow():
        ledger = runner.ledger()
        busy = ledger.allocate(ResourceRequest(gpus=1, node="node3", label="busy"), timeout=1)
        threading.Timer(1.0, ledger.release, (busy.lease_id,)).start()
        gang = run_gang(ledger, Escher(ledger), size=4, steps=3, timeout_s=0.3, seed=0, workdir=str(tmp_path))
        clean = _pool_is_clean("escher-rollback")
        monkeypatch.setattr(tasks.escher.gang, "train", crashing_train)
        started = time.monotonic()
        with pytest.raises(RuntimeError):
            run_gang(ledger, Escher(ledger), size=2, steps=10_000, timeout_s=5, seed=0, workdir=str(tmp_path))
        return gang, clean, time.monotonic() - started

    gang, clean_after_the_gang, crashed_gang_s = gang_flow()
    assert gang["attempts"] >= 2 and gang["gang_latency_s"] >= 0.6  # the busy GPU was freed 1 s in
    assert sorted(m["node"] for m in gang["members"]) == ["node0", "node1", "node2", "node3"]
    assert max(m["started"] for m in gang["members"]) < min(m["ended"] for m in gang["members"])
    assert clean_after_the_gang
    assert crashed_gang_s < RENDEZVOUS_TIMEOUT.total_seconds() / 3
    assert _pool_is_clean("escher-rollback")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_trial_with_no_room_to_start_fails_the_run_and_leaves_nothing_behind(state_dir):
    """Every GPU is held but half of node0's, so EscherTune has room for one of its trial's two workers and no short
    job: the run fails, and neither ``trial-long`` nor any lease of the run is left on the pool."""
    from gpu.placement import ResourceRequest

    ledger = GpuPool(name="escher", device_backend="simulated", simulated="1x16GiB", nodes=4).open_ledger()
    held = [ledger.allocate(ResourceRequest(gpus=0.5 if i == 0 else 1, node=f"node{i}", label="busy"), timeout=5)
            for i in range(4)]
    with pytest.raises(RuntimeError, match="no room for trial-long"):
        escher_policies(policies=["tune"], steps=2, tracking=False)
    assert sorted(lease.lease_id for lease in ledger.leases()) == sorted(h.lease_id for h in held)
    assert all(set(r) <= {"CPU", "GPU"} for r in ledger.cluster_status().values())
    for lease in held:
        ledger.release(lease.lease_id)


def _members_in_threads(rendezvous, ranks, steps=50):
    """Run ``gang_member``'s body for ``ranks`` in threads (as thread mode does); each one's error or result."""
    import threading

    from tasks.escher.gang import gang_member

    outcome: dict[int, BaseException | dict] = {}

    def member(rank):
        try:
            outcome[rank] = gang_member.fn(rank, rendezvous.world, steps, rendezvous)
        except BaseException as exc:  # noqa: BLE001 - the test reads every member's end
            outcome[rank] = exc

    threads = [threading.Thread(target=member, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    return threads, outcome


def test_an_abort_racing_the_removal_of_the_rendezvous_never_finds_its_folder_gone(tmp_path, monkeypatch):
    """A member's future callback aborts the rendezvous while the flow, seeing every member ended, removes it. The
    folder must not go between abort's check and its store opening the file: torch's FileStore then retries the
    open for 300 s holding the GIL (seen: a crashed gang's flow frozen for five minutes). Here the removal is
    started at that very moment and must wait for the abort."""
    import threading

    from tasks.escher.jobs import RENDEZVOUS_TIMEOUT
    from tasks.runtime.rendezvous import Rendezvous

    rendezvous = Rendezvous.create(str(tmp_path), "race-", 2, RENDEZVOUS_TIMEOUT)
    folder = os.path.dirname(rendezvous.path)
    opened = Rendezvous.store
    remover = threading.Thread(target=rendezvous.remove)
    seen = {}

    def store_while_removing(self):
        remover.start()
        remover.join(timeout=0.5)  # the removal had half a second to happen under the abort
        seen["folder_there"] = os.path.isdir(folder)
        if not seen["folder_there"]:
            raise RuntimeError("the folder went mid-abort (FileStore would retry its open for 300 s)")
        return opened(self)

    monkeypatch.setattr(Rendezvous, "store", store_while_removing)
    rendezvous.abort("member 1 ended Failed")
    remover.join(timeout=10)
    assert seen == {"folder_there": True} and not remover.is_alive() and not os.path.exists(folder)


def test_a_member_joining_a_removed_rendezvous_is_told_its_gang_has_ended(tmp_path):
    """A member that starts after its gang was torn down (the flow stopped) fails at once: a FileStore in a missing
    folder would retry its open for 300 s, holding the GIL of the process it runs in."""
    import time

    from tasks.escher.jobs import RENDEZVOUS_TIMEOUT
    from tasks.runtime.rendezvous import GangAborted, Rendezvous

    rendezvous = Rendezvous.create(str(tmp_path), "gone-", 2, RENDEZVOUS_TIMEOUT)
    rendezvous.remove()
    started = time.monotonic()
    with pytest.raises(GangAborted, match="its gang has ended"):
        rendezvous.join(0)
    assert time.monotonic() - started < 5  # not FileStore's 300 s
    rendezvous.abort("late")  # and the launcher's abort of a removed one is a no-op


def test_members_whose_peer_never_starts_end_as_soon_as_the_rendezvous_is_aborted(tmp_path):
    """Member 2 of 3 never starts (its task failed before it joined): once the flow aborts the rendezvous, the
    two waiting members end with GangAborted at once instead of after the 60 s rendezvous timeout."""
    import time

    from tasks.escher.jobs import RENDEZVOUS_TIMEOUT
    from tasks.runtime.rendezvous import GangAborted, Rendezvous

    rendezvous = Rendezvous(str(tmp_path / "store"), 3, RENDEZVOUS_TIMEOUT)
    threads, outcome = _members_in_threads(rendezvous, [0, 1])
    rendezvous.store().wait(["joined-0", "joined-1"], RENDEZVOUS_TIMEOUT)   # both are waiting for member 2
    aborted = time.monotonic()
    rendezvous.abort("member 2 ended: Crashed")
    for t in threads:
        t.join(RENDEZVOUS_TIMEOUT.total_seconds())
    assert time.monotonic() - aborted < 10          # the old wait: 60 s
    assert all(isinstance(outcome[r], GangAborted) and "member 2 ended: Crashed" in str(outcome[r]) for r in (0, 1))


def test_a_member_that_crashes_mid_gang_ends_its_peer_at_once(tmp_path, monkeypatch):
    """Member 1 raises after its first all-reduce: it destroys its process group, so member 0's next all-reduce
    fails at once (a connection error) instead of waiting out the collective's 60 s timeout."""
    import time

    import tasks.escher.gang
    from tasks.escher.jobs import RENDEZVOUS_TIMEOUT, train
    from tasks.runtime.rendezvous import Rendezvous

    def crashing_train(model, steps, shard, shards, average):
        if shard == 1:
            train(model, 1, shard, shards, average)
            raise RuntimeError("member 1 crashed")
        return train(model, steps, shard, shards, average)

    monkeypatch.setattr(tasks.escher.gang, "train", crashing_train)
    started = time.monotonic()
    threads, outcome = _members_in_threads(Rendezvous(str(tmp_path / "store"), 2, RENDEZVOUS_TIMEOUT), [0, 1],
                                          steps=10_000)
    for t in threads:
        t.join(RENDEZVOUS_TIMEOUT.total_seconds())
    assert time.monotonic() - started < 15          # the old wait: 60 s
    assert str(outcome[1]) == "member 1 crashed"
    assert isinstance(outcome[0], RuntimeError) and "Connection" in str(outcome[0])
