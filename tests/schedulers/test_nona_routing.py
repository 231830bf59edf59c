"""Nona as the serving frontend's per-query routing: a query's stages follow its one sampled placement (§III-C)."""

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.nona.optimizer import Cluster, LookupTable, NonaModel, QueryClass, solve
from gpu.schedulers.nona.dag import Dag
from gpu.schedulers.nona.controller import NonaController, NonaRouting, Query

STAGES = {f"q/{t}": ("q", t) for t in "abcd"}


def diamond(bytes_: float) -> Dag:
    return Dag.build("q", {"a": 1e-3, "b": 20e-3, "c": 20e-3, "d": 1e-3},
                     {("a", "b"): bytes_, ("a", "c"): bytes_, ("b", "d"): bytes_, ("c", "d"): bytes_})


def routing(mu: float, bytes_: float = 1e3, rate: float = 5.0, servers: int = 3) -> NonaRouting:
    dag = diamond(bytes_)
    model = NonaModel([QueryClass(dag, rate)], Cluster(servers=servers, nu=1.0, mu=mu))
    return NonaRouting(NonaController({"q": dag}, LookupTable((solve(model),)), servers), STAGES)


def test_every_stage_of_a_query_goes_where_its_one_placement_put_it():
    r = routing(mu=1e9)  # a fast link: the long branches are worth running in parallel
    r.set_hosts({sid: [4, 7, 9] for sid in STAGES})
    queries = np.arange(300)
    where = {t: r.where(0.0, f"q/{t}", queries) for t in "abcd"}
    for q in queries.tolist():
        placement = r.controller.on_arrival(0.0, Query(q, "q", (4, 7, 9)))
        assert [where[t][q] for t in "abcd"] == [placement.server(t) for t in "abcd"]
    assert np.mean(where["b"] != where["c"]) > 0.5  # mostly distributed on a fast link


def test_a_slow_link_keeps_queries_on_one_node():
    r = routing(mu=1e4, bytes_=1e3)  # 0.1 s per hand-off against 20 ms branches
    r.set_hosts({sid: [0, 1, 2] for sid in STAGES})
    nodes = np.stack([r.where(0.0, f"q/{t}", np.arange(200)) for t in "abcd"])
    assert (nodes == nodes[0]).all() and len(set(nodes[0].tolist())) == 3  # roots uniform, queries whole


def test_stages_not_hosted_everywhere_or_not_nona_s_follow_the_shares():
    r = routing(mu=1e9)
    r.set_hosts({"q/a": [0, 1], "q/b": [0], "q/c": [1], "q/d": [0, 1]})  # no node hosts every stage
    assert r.where(0.0, "q/a", np.arange(3)) is None
    r.set_hosts({sid: [0, 1] for sid in STAGES})
    assert r.where(0.0, "other", np.arange(3)) is None
    assert set(r.where(0.0, "q/a", np.arange(50)).tolist()) <= {0, 1}  # a lost node: re-sampled among the live


def test_a_stage_naming_no_task_is_one_config_error():
    ctl = routing(mu=1e9).controller
    with pytest.raises(ConfigError, match="stages.q/x"):
        NonaRouting(ctl, {"q/x": ("q", "x")})
