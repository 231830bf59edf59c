"""The serving rollout with ``placement: nona`` on the shipped diamond spec, in a Prefect server: Nona keeps
queries on one node when the emulated link is slow, so fewer hand-offs cross it and queries finish sooner than
under Nona's Opportunistic baseline on the same nodes and trace (Nona §II's motivating trade-off); Expert,
rating its mixes on the same link, distributes none either; the figures of each land in MLflow."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu.errors import ConfigError
from resource_blocks import GpuPool, MlflowTarget
from tasks.runtime.runners import GpuTaskRunner
from tasks.serving.spec import load_spec

SPEC = str(Path(__file__).resolve().parent.parent / "scenarios" / "serving" / "diamond_nona.yaml")


def runner(name: str) -> GpuTaskRunner:
    return GpuTaskRunner(pool=GpuPool(name=name, device_backend="simulated"), mode="thread",
                         tracking=MlflowTarget(experiment="nona-vs-baselines"))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_nona_placement_crosses_the_slow_link_less_and_finishes_queries_sooner(state_dir):
    from mlflow import MlflowClient

    from flows.serving_rollout import serving_rollout

    spec = yaml.safe_load(Path(SPEC).read_text())  # its 2-s epochs: one epoch of measured feedback within 3 s
    results = {p: serving_rollout.with_options(task_runner=runner(f"nona-{p}"))(spec, duration_s=seconds, placement=p)
               for p, seconds in (("nona", 3), ("opportunistic", 3), ("expert", 2))}
    nona, opportunistic, expert = results["nona"], results["opportunistic"], results["expert"]
    for r in results.values():
        queries = r["queries"]["block"]["queries"]
        assert queries > 25 * r["duration_s"] and r["handoffs"] >= 3 * queries  # b, c, d of every query
        assert GpuPool(name=f"nona-{r['placement']}", device_backend="simulated").open_ledger().leases() == []
    # Opportunistic sends one branch of every query across: 2 of its 4 hand-offs cross the slow link
    assert opportunistic["cross_node_share"] > 0.4 and nona["cross_node_share"] < 0.5 * opportunistic["cross_node_share"]
    assert nona["link_transfers"] < opportunistic["link_transfers"]
    assert nona["queries"]["block"]["mean_jct_ms"] < opportunistic["queries"]["block"]["mean_jct_ms"]
    theta = nona["nona_theta"]["block:a"]  # the diamond's one subgraph, rooted at a: its 5 groupings
    assert len(theta) == 5 and sum(theta) == pytest.approx(1.0) and "nona_theta" not in opportunistic
    (epoch,) = nona["nona_epochs"]  # at 2 s Nona took the measured rate and the four stages' service times
    assert epoch["t_s"] == 2.0 and 25 < epoch["rates"]["block"] < 55 and len(epoch["service_ms"]) == 4
    assert epoch["thetas"] == nona["nona_theta"] and opportunistic["nona_epochs"] == []
    # a 10-ms transfer costs more than running the sub-ms branches side by side saves: Expert's best q is 0
    assert expert["cross_node_handoffs"] == 0 and expert["nona_epochs"] == []
    client = MlflowClient(MlflowTarget(experiment="nona-vs-baselines").resolved_uri())
    for r in results.values():
        logged = client.get_run(r["mlflow_run_id"]).data
        assert logged.params["placement"] == r["placement"] and r["mlflow_errors"] == []
        for key in ("mean_jct_ms", "p99_jct_ms"):
            assert logged.metrics[f"query_block_{key}"] == pytest.approx(r["queries"]["block"][key])
        assert logged.metrics["cross_node_handoffs"] == r["cross_node_handoffs"]


def test_the_shipped_nona_spec_has_a_join_and_a_link():
    sp = load_spec(SPEC)
    assert sp.placement == "nona" and sp.link_mu == 2_560_000 and sp.nodes == 2
    assert sp.chains()["block/d"] == (("block/b", "block/c"), 1.0)


def test_nona_placement_without_a_link_is_refused_before_anything_runs():
    from flows.serving_rollout import prepare

    spec = {"queries": [{"id": "q", "slo_ms": 100, "rate": 10, "stages": [
        {"name": "a", "model": "digits_mlp"}, {"name": "b", "model": "digits_mlp", "parent": "a"}]}]}
    with pytest.raises(ConfigError, match="link.mu"):
        prepare(spec, None, None, "nona")
    with pytest.raises(ConfigError, match="placement"):
        prepare(spec, None, None, "nonaa")


def test_a_join_with_fanout_or_an_unknown_parent_is_named():
    from tasks.serving.spec import parse_spec

    def spec(d):
        return {"queries": [{"id": "q", "slo_ms": 100, "rate": 10, "stages": [
            {"name": "a", "model": "digits_mlp"}, {"name": "b", "model": "digits_mlp", "parent": "a"},
            {"name": "c", "model": "digits_mlp", "parent": "a"}, d]}]}

    with pytest.raises(ConfigError, match="gamma"):
        parse_spec(spec({"name": "d", "model": "digits_mlp", "parents": ["b", "c"], "gamma": 2}))
    with pytest.raises(ConfigError, match="parents"):
        parse_spec(spec({"name": "d", "model": "digits_mlp", "parents": ["b", "x"]}))
    with pytest.raises(ConfigError, match="parents"):
        parse_spec(spec({"name": "d", "model": "digits_mlp", "parent": "b", "parents": ["b", "c"]}))


def test_nona_baselines_but_expert_need_no_link_and_bad_flow_arguments_are_named_before_anything_runs():
    from flows.serving_rollout import prepare

    spec = {"queries": [{"id": "q", "slo_ms": 100, "rate": 10, "stages": [
        {"name": "a", "model": "digits_mlp"}, {"name": "b", "model": "digits_mlp", "parent": "a"}]}]}
    assert [prepare(spec, placement=p).placement for p in ("undistributed", "opportunistic", "random")] == [
        "undistributed", "opportunistic", "random"]
    for kwargs, field in (({"placement": "expert"}, "link.mu"), ({"placement": "fair"}, "placement"),
                          ({"mode": "fork"}, "mode"),
                          ({"backend": "k8s"}, "backend"), ({"placement": "random", "backend": "ray"}, "placement")):
        with pytest.raises(ConfigError) as err:
            prepare(spec, **kwargs)
        assert err.value.field == field
