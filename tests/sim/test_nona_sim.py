"""Nona's network-aware simulator (§IV-A): servers, one FIFO bottleneck link, joins, Spark, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from gpu.errors import ConfigError
from gpu.schedulers.nona.optimizer import Cluster, NonaModel, QueryClass
from gpu.schedulers.nona.dag import contract
from gpu.schedulers.nona.controller import GroupingSampler
from gpu.sim.nona.run import parse, run
from gpu.sim.nona.engine import BACKGROUND_COMM, Workload, simulate
from gpu.sim.nona.workloads import motivating_query
from gpuflows.cli import main

ROOT = Path(__file__).resolve().parents[2]
F = contract(motivating_query()).dag
TWO = Cluster(2, 1000.0, 10e9)  # §II: two servers, 80 Gbps, ops in ms


def _one_query(theta) -> list:
    """A single query (rate so low that queries never meet) with the grouping ``theta`` picks."""
    sampler = GroupingSampler("t", {"f": F}, {("f", "sum"): theta}, 2)
    return simulate(TWO, Workload({"f": (F, 0.1)}, horizon_s=100.0, warmup_s=0.0, seed=4), sampler)


@pytest.mark.parametrize("theta, jct_ms", [((1, 0, 0, 0, 0), 14.0), ((0, 0, 0, 1, 0), 32.0), ((0, 0, 0, 0, 1), 22.0)])
def test_lone_query_takes_the_papers_times_and_its_join_waits_for_both_inputs(theta, jct_ms):
    """§II: allocation 2 → 14 ms, allocation 1 → 32 ms, one server → 22 ms; the sink runs once per query."""
    records = _one_query(theta)
    assert len(records) >= 1 and len({r.arrival for r in records}) == len(records)  # one record per query
    assert [round(r.jct * 1e3, 9) for r in records] == [jct_ms] * len(records)


def test_background_transfers_wait_what_the_pk_formula_predicts():
    """(VIII) against the simulated link: background transfers see the mean wait φ (Poisson arrivals see
    time averages), with query transfers of another size sharing the link at ρ ≈ 0.5."""
    theta = (0.5, 0, 0, 0, 0.5)
    cluster = Cluster(80, 1000.0, 10e9, bg_comm_rate=200.0, bg_comm_bytes=20e6)
    model = NonaModel([QueryClass(F, 100.0)], cluster)
    pred = model.predict(np.array(theta, float))
    records = simulate(cluster, Workload({"f": (F, 100.0)}, horizon_s=60.0, warmup_s=5.0, seed=1),
                       GroupingSampler("t", {"f": F}, {("f", "sum"): theta}, 80))
    waits = [r.queued for r in records if r.klass == BACKGROUND_COMM]
    assert pred.rho == pytest.approx(0.5)
    assert np.mean(waits) == pytest.approx(pred.phi, rel=0.1)


def test_every_scheme_sees_the_same_arrivals():
    wl = Workload({"f": (F, 30.0)}, horizon_s=10.0, warmup_s=0.0, seed=2)
    placed = simulate(TWO, wl, GroupingSampler("t", {"f": F}, {("f", "sum"): (0, 0, 0, 0, 1)}, 2))
    spark = simulate(TWO, wl, None)
    assert sorted(r.arrival for r in placed) == sorted(r.arrival for r in spark)


def test_spark_cannot_tell_the_two_allocations_apart():
    """§II: a congestion-oblivious scheduler spreads the branches over the two idle servers either way, so a
    lone query takes 14, 22 or 32 ms (sink placed by chance), allocation 1's 32 ms included."""
    records = simulate(TWO, Workload({"f": (F, 0.1)}, horizon_s=400.0, warmup_s=0.0, seed=4), None)
    jcts = {round(r.jct * 1e3, 6) for r in records}
    assert jcts <= {14.0, 22.0, 32.0} and 32.0 in jcts and all(r.servers == 2 for r in records)


def test_sjf_cp_serves_the_job_with_least_work_first_on_live_state():
    """The Decima-style list scheduler: on one busy server, a 1 ms job waiting beside 40 ms ones goes first,
    where Spark's fair scheduler (every waiting job runs no task: oldest first) makes it wait its turn."""
    from gpu.schedulers.nona.dag import Dag

    short, long = Dag.build("short", {"t": 1.0}, {}), Dag.build("long", {"t": 40.0}, {})
    one = Cluster(1, 1000.0, 10e9)
    wl = Workload({"short": (short, 10.0), "long": (long, 20.0)}, horizon_s=60.0, warmup_s=5.0, seed=3)
    mean = {live: {k: np.mean([r.jct for r in simulate(one, wl, None, live=live) if r.klass == k])
                   for k in ("short", "long")} for live in ("spark", "sjf_cp")}
    assert mean["sjf_cp"]["short"] < 0.3 * mean["spark"]["short"]
    assert mean["sjf_cp"]["long"] > mean["spark"]["long"]


def _scenario(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((ROOT / "scenarios/nona/motivating.yaml").read_text())
    data.update(changes)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
def test_cli_runs_the_shipped_scenario_and_nona_beats_the_fixed_placements(tmp_path, capsys):
    path = _scenario(tmp_path, simulation={"horizon_s": 20, "warmup_s": 4})
    out = tmp_path / "out.json"
    assert main(["simulate", "nona", str(path), "--policy", "nona", "--policy", "undistributed",
                 "--policy", "opportunistic", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["nona_inference_mean_ms"] < summary["undistributed_inference_mean_ms"]
    assert summary["nona_inference_mean_ms"] < summary["opportunistic_inference_mean_ms"]
    assert "nona" in capsys.readouterr().out


def test_paper_scenario_parses_with_table_2_classes():
    from gpu.scenario import load_scenario

    setup = parse(load_scenario(ROOT / "scenarios/nona/paper_80.yaml"))
    assert [len(setup.dags[m].tasks) for m in ("resnet18", "vgg16", "alexnet")] == [10, 1, 1]
    assert setup.cluster.servers == 80 and setup.cluster.mu == pytest.approx(1.25e9)


@pytest.mark.parametrize("changes, field", [
    ({"load": 0.3}, "load"),
    ({"cluster": {"servers": 2, "flops": 1000, "link_gbps": 0}}, "cluster.link_gbps"),
    ({"classes": [{"name": "x", "model": "bert"}], "load": 0.2}, "classes[0].model"),
    ({"classes": [{"name": "f", "rate": -1, "tasks": {"a": 1}}]}, "classes.f.rate"),
    ({"simulation": {"horizon_s": 5, "warmup_s": 5}}, "simulation.warmup_s"),
    ({"policies": ["nona", "decima"]}, "policy"),
    ({"cluster": {"servers": 2, "flops": 1000, "link_gbps": 1, "mtu": 9000}}, "cluster.mtu"),
])
def test_bad_scenarios_are_one_config_error(tmp_path, changes, field):
    with pytest.raises(ConfigError) as err:
        run(str(_scenario(tmp_path, **changes)))
    assert err.value.field == field


def test_phases_scale_every_arrival_stream():
    wl = Workload({"f": (F, 10.0)}, horizon_s=100.0, warmup_s=0.0, seed=3, phases=((50.0, 3.0),))
    arrivals = np.array([r.arrival for r in simulate(Cluster(8, 1000.0, 10e9), wl, GroupingSampler(
        "t", {"f": F}, {("f", "sum"): (0, 0, 0, 0, 1)}, 8))])
    before, after = (arrivals < 50).sum(), (arrivals >= 50).sum()
    assert before == pytest.approx(500, rel=0.15) and after == pytest.approx(1500, rel=0.1)


@pytest.mark.slow
def test_lookup_table_resolves_when_the_rate_jumps_and_beats_theta_solved_for_the_old_rate(tmp_path):
    """§III-A: θ for 40 queries/s saturates the link at 500/s; the controller measures the jump, re-solves
    and swaps θ in while serving."""
    data = yaml.safe_load((ROOT / "scenarios/nona/rate_shift.yaml").read_text())
    data["simulation"].update(horizon_s=45)
    path = tmp_path / "shift.yaml"
    path.write_text(yaml.safe_dump(data))
    rows = {r["policy"]: r for r in run(str(path), ["nona", "nona_table"]).table}
    assert rows["nona_table"]["table_resolves"] >= 1 and rows["nona_table"]["table_switches"] >= 1
    assert rows["nona_table"]["inference_mean_ms"] < rows["nona"]["inference_mean_ms"] / 2
