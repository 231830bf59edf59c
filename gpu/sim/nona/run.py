"""``gpuflows simulate nona SCENARIO``: DAG inference queries on a cluster with one bottleneck link (§IV).

Scenario format: ``docs/nona.md``; example: ``scenarios/nona/paper_80.yaml``. Policies (§IV-A):

* ``nona`` — θ solved for the scenario's rates and link (``gpu.schedulers.nona.optimizer.solve``), sampled per query;
* ``nona_star`` — θ solved once at ``nona.star_load`` compute load and ``nona.star_link_gbps``, reused;
* ``nona_table`` — ``NonaController`` with θ solved at ``nona.table_scales`` × the rates; every
  ``simulation.epoch_s`` the measured rates pick the nearest entry, or trigger a re-solve (§III-A);
* ``expert`` — q·Opportunistic + (1−q)·undistributed with q grid-searched in this simulator (best mean JCT);
* ``opportunistic``, ``random``, ``undistributed`` — the fixed placements of ``gpu.schedulers.nona.baselines``;
* ``spark`` — Spark's fair scheduler on live state (``gpu.sim.nona.engine``);
* ``sjf_cp`` — the Decima-style list scheduler on live state (shortest job first, critical path within a job),
  in place of Decima, whose trained model is not available.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import (MAX_FANOUT, MAX_MB, MAX_RATE, MAX_SECONDS, MAX_SEED, choose, entries, flag, fraction,
                          integer, known_fields, label, load_scenario, mapping, policy_names, positive, require,
                          section, within_events)
from gpu.schedulers.nona.optimizer import Cluster, NonaModel, QueryClass, Solution, solve, solve_table
from gpu.schedulers.nona.baselines import (RandomPlacement, expert_thetas, opportunistic_thetas,
                                           undistributed_thetas)
from gpu.schedulers.nona.dag import Dag, contract
from gpu.schedulers.nona.controller import GroupingSampler, NonaController
from gpu.schedulers.nona.policies import POLICIES
from gpu.sim.nona.engine import BACKGROUND_COMM, BACKGROUND_COMPUTE, JobRecord, Placer, Workload, simulate
from gpu.sim.nona.workloads import motivating_query, paper_models

MODELS = {**{name: (lambda name=name: paper_models()[name]) for name in paper_models()}, "motivating": motivating_query}
GBPS = 1e9 / 8  # bytes per second in one Gbit/s
MAX_SERVERS = 100_000
MAX_FLOPS = 1e18  # operations per task and per second of a server: an exaFLOP
MAX_GBPS = 100_000.0  # a link of 100 Tb/s
MAX_STARTS = 1_000  # restarts of Nona's solver
SCENARIO_KEYS = ("name", "seed", "policies", "cluster", "background", "load", "classes", "simulation", "nona")


@dataclass(frozen=True)
class Setup:
    """A parsed scenario: contracted DAGs and rates, the cluster, the run length, Nona's knobs."""

    name: str
    dags: dict[str, Dag]
    rates: dict[str, float]
    cluster: Cluster
    workload: Workload
    background_ratio: float
    starts: int
    star_load: float
    star_link_gbps: float
    expert_grid: tuple[float, ...]
    table_scales: tuple[float, ...] = (0.5, 1.0, 2.0)
    epoch_s: float = 5.0


def _dag(row: Mapping[str, Any], where: str) -> Dag:
    """A class's DAG: a named model, or ``tasks`` (ops per task) and ``edges`` ([{from, to, mb}])."""
    name = label(require(row, "name", f"{where}."), f"{where}.name")
    if "model" in row:
        if "tasks" in row or "edges" in row:
            raise ConfigError(f"{where}.model", row["model"], "give a model or tasks/edges, not both")
        dag = choose(row["model"], f"{where}.model", MODELS)()
        return Dag(name, dag.tasks, dag.ops, dag.edges)
    tasks = mapping(require(row, "tasks", f"{where}."), f"{where}.tasks", optional=False)
    ops = {str(t): positive(v, f"{where}.tasks.{t}", allow_zero=True, upper=MAX_FLOPS) for t, v in tasks.items()}
    edges = {}
    for i, e in enumerate(entries(row.get("edges"), f"{where}.edges", ("from", "to", "mb"))):
        key = (label(require(e, "from", f"{where}.edges[{i}]."), f"{where}.edges[{i}].from"),
               label(require(e, "to", f"{where}.edges[{i}]."), f"{where}.edges[{i}].to"))
        edges[key] = positive(require(e, "mb", f"{where}.edges[{i}]."), f"{where}.edges[{i}].mb", allow_zero=True,
                              upper=MAX_MB) * 1e6
    return Dag.build(name, ops, edges)


def rates_for_load(dags: Mapping[str, Dag], load: float, servers: int, nu: float) -> dict[str, float]:
    """Equal per-class rates giving compute load Σ_j λ_j S_j / N = ``load`` (§IV-A, normalised by N)."""
    work = sum(d.total_ops for d in dags.values()) / nu
    return {k: load * servers / work for k in dags}


def parse(data: Mapping[str, Any]) -> Setup:
    """Check every field of a scenario (``docs/nona.md``) and build the setup; errors name the field."""
    known_fields(data, SCENARIO_KEYS, "")
    seed = integer(data.get("seed", 0), "seed", minimum=0, maximum=MAX_SEED)
    cl = section(require(data, "cluster"), "cluster", ("servers", "flops", "link_gbps", "compute_queueing"),
                 optional=False)
    servers = integer(require(cl, "servers", "cluster."), "cluster.servers", minimum=1)
    if servers > MAX_SERVERS:
        raise ConfigError("cluster.servers", servers, f"at most {MAX_SERVERS:,} servers")
    nu = positive(require(cl, "flops", "cluster."), "cluster.flops", upper=MAX_FLOPS)
    mu = positive(require(cl, "link_gbps", "cluster."), "cluster.link_gbps", upper=MAX_GBPS) * GBPS
    queueing = flag(cl.get("compute_queueing", True), "cluster.compute_queueing")
    rows = entries(require(data, "classes"), "classes", ("name", "model", "tasks", "edges", "rate"))
    if not rows:
        raise ConfigError("classes", rows, "needs at least one query class")
    dags: dict[str, Dag] = {}
    for i, row in enumerate(rows):
        dag = contract(_dag(row, f"classes[{i}]")).dag
        if dag.name in dags:
            raise ConfigError(f"classes[{i}].name", dag.name, "class names must be unique")
        dags[dag.name] = dag
    given = {r["name"]: r["rate"] for r in rows if "rate" in r}
    if "load" in data:
        if given:
            raise ConfigError("load", data["load"], "give load or per-class rates, not both")
        rates = rates_for_load(dags, fraction(data["load"], "load"), servers, nu)
    else:
        if len(given) != len(rows):
            raise ConfigError("classes", [r["name"] for r in rows if "rate" not in r], "need a rate, or give load")
        rates = {str(k): positive(v, f"classes.{k}.rate", allow_zero=True, upper=MAX_RATE) for k, v in given.items()}
    bg = section(data.get("background"), "background", ("ratio", "compute_s", "comm_mb"))
    ratio = positive(bg.get("ratio", 0.01), "background.ratio", allow_zero=True, upper=MAX_FANOUT)
    bg_rate = ratio * sum(rates.values())
    cluster = Cluster(servers, nu, mu, bg_compute_rate=bg_rate,
                      bg_compute_ops=positive(bg.get("compute_s", 0.01), "background.compute_s", allow_zero=True,
                                              upper=MAX_SECONDS) * nu,
                      bg_comm_rate=bg_rate,
                      bg_comm_bytes=positive(bg.get("comm_mb", 10.0), "background.comm_mb", allow_zero=True,
                                             upper=MAX_MB) * 1e6,
                      compute_queueing=queueing)
    sim = section(data.get("simulation"), "simulation", ("horizon_s", "warmup_s", "epoch_s", "phases"))
    horizon = positive(sim.get("horizon_s", 60.0), "simulation.horizon_s", upper=MAX_SECONDS)
    warmup = positive(sim.get("warmup_s", horizon / 6), "simulation.warmup_s", allow_zero=True)
    if warmup >= horizon:
        raise ConfigError("simulation.warmup_s", warmup, f"must be below horizon_s={horizon:g}")
    phases = tuple((positive(require(ph, "start_s", f"simulation.phases[{i}]."), f"simulation.phases[{i}].start_s",
                             allow_zero=True, upper=MAX_SECONDS),
                    positive(require(ph, "scale", f"simulation.phases[{i}]."), f"simulation.phases[{i}].scale",
                             allow_zero=True, upper=MAX_FANOUT))
                   for i, ph in enumerate(entries(sim.get("phases"), "simulation.phases", ("start_s", "scale"))))
    peak = max([1.0, *(scale for _, scale in phases)])
    within_events(sum(rates.values()) * (1 + ratio) * peak * horizon, "simulation.horizon_s", horizon,
                  "queries (the rates, background and peak phase scale x horizon_s)")
    nona = section(data.get("nona"), "nona", ("starts", "star_load", "star_link_gbps", "expert_grid", "table_scales"))
    grid, scales = nona.get("expert_grid", [0.0, 0.25, 0.5, 0.75, 1.0]), nona.get("table_scales", [0.5, 1.0, 2.0])
    for field, values in (("nona.expert_grid", grid), ("nona.table_scales", scales)):
        if not isinstance(values, list) or not values:
            raise ConfigError(field, values, "must be a non-empty list of numbers")
    return Setup(label(data.get("name", "nona"), "name"), dags, rates, cluster,
                 Workload({k: (d, rates[k]) for k, d in dags.items()}, horizon, warmup, seed, phases), ratio,
                 integer(nona.get("starts", 4), "nona.starts", minimum=1, maximum=MAX_STARTS),
                 fraction(nona.get("star_load", 0.5), "nona.star_load"),
                 positive(nona.get("star_link_gbps", 10.0), "nona.star_link_gbps", upper=MAX_GBPS),
                 tuple(fraction(q, f"nona.expert_grid[{i}]") for i, q in enumerate(grid)),
                 tuple(positive(x, f"nona.table_scales[{i}]", upper=MAX_FANOUT) for i, x in enumerate(scales)),
                 positive(sim.get("epoch_s", 5.0), "simulation.epoch_s", upper=MAX_SECONDS))


def model_for(setup: Setup, rates: Mapping[str, float] | None = None, cluster: Cluster | None = None) -> NonaModel:
    """Nona's queueing model of the setup (optionally at other rates or on another cluster)."""
    rates = rates or setup.rates
    cluster = cluster or setup.cluster
    bg = setup.background_ratio * sum(rates.values())
    cluster = replace(cluster, bg_compute_rate=bg, bg_comm_rate=bg)
    return NonaModel([QueryClass(d, rates[k]) for k, d in setup.dags.items()], cluster)


def solve_nona(setup: Setup) -> Solution:
    return solve(model_for(setup), starts=setup.starts, seed=setup.workload.seed)


def solve_nona_star(setup: Setup) -> Solution:
    """θ solved once at the reference load and link (§IV-D), whatever the scenario's actual conditions."""
    c = setup.cluster
    rates = rates_for_load(setup.dags, setup.star_load, c.servers, c.nu)
    return solve(model_for(setup, rates, replace(c, mu=setup.star_link_gbps * GBPS)), starts=setup.starts,
                 seed=setup.workload.seed)


@dataclass(frozen=True)
class Outcome:
    """One policy's run: its jobs, and for samplers the θ used (Nona's prediction, Expert's q)."""

    policy: str
    records: list[JobRecord]
    solution: Solution | None = None
    q: float | None = None
    table: dict[str, float] | None = None  # nona_table: entries solved, switches, re-solves
    link_rho: float = float("nan")  # the link's measured utilisation between the warm-up and the horizon


def run_policy(setup: Setup, policy: str) -> Outcome:
    """Simulate one policy on the setup."""
    choose(policy, "policy", list(POLICIES))
    n, seed, dags = setup.cluster.servers, setup.workload.seed, setup.dags
    seen: dict[str, float] = {}

    def sim(placer, **kw) -> list[JobRecord]:
        return simulate(setup.cluster, setup.workload, placer, observed=seen, **kw)

    if policy in ("spark", "sjf_cp"):
        return Outcome(policy, sim(None, live=policy), link_rho=seen["link_rho"])
    if policy == "random":
        return Outcome(policy, sim(RandomPlacement(dags, seed)), link_rho=seen["link_rho"])
    if policy == "nona_table":
        return _run_table(setup)
    if policy == "expert":
        runs = []
        for q in setup.expert_grid:
            records = sim(GroupingSampler("expert", dags, expert_thetas(dags, n, q), n, seed))
            runs.append((q, records, seen["link_rho"]))
        q, records, rho = min(runs, key=lambda r: np.mean([x.jct for x in r[1]]))
        return Outcome(policy, records, q=q, link_rho=rho)
    solution = None
    if policy in ("nona", "nona_star"):
        solution = solve_nona(setup) if policy == "nona" else solve_nona_star(setup)
        thetas = solution.thetas
    else:
        thetas = (opportunistic_thetas if policy == "opportunistic" else undistributed_thetas)(dags, n)
    placer: Placer = GroupingSampler(policy, dags, thetas, n, seed)
    return Outcome(policy, sim(placer), solution, link_rho=seen["link_rho"])


def _run_table(setup: Setup) -> Outcome:
    """Nona as a controller with a lookup table: each epoch's measured rates pick the nearest entry; rates
    beyond ±40 % of every entry are re-solved (instantly here; a failed re-solve keeps the table in force)."""
    seed, n = setup.workload.seed, setup.cluster.servers
    table = solve_table(model_for(setup), setup.table_scales, starts=setup.starts, seed=seed)
    ctrl = NonaController(setup.dags, table, n, seed=seed)
    ctrl.on_epoch(0.0, setup.rates)
    log = {"entries": float(len(table.entries)), "switches": 0.0, "resolves": 0.0}

    def epoch(now: float, rates: dict[str, float]) -> None:
        before = ctrl.entry
        choice = ctrl.on_epoch(now, rates)
        if choice.resolve and all(r > 0 for r in rates.values()):
            try:
                ctrl.add_solution(solve(model_for(setup, rates), starts=setup.starts, seed=seed))
                log["resolves"] += 1
                ctrl.on_epoch(now, rates)
            except ConfigError:
                pass
        log["switches"] += float(ctrl.entry != before)

    records = simulate(setup.cluster, setup.workload, ctrl, epoch_s=setup.epoch_s, on_epoch=epoch)
    return Outcome("nona_table", records, table=log)


def stats(records: list[JobRecord]) -> dict[str, float]:
    """Mean and 99th-percentile JCT (ms) over all jobs and over inference jobs, background jobs unqueued."""
    jct = np.array([r.jct for r in records])
    inference = np.array([r.jct for r in records if r.klass not in (BACKGROUND_COMPUTE, BACKGROUND_COMM)])
    background = [r for r in records if r.klass in (BACKGROUND_COMPUTE, BACKGROUND_COMM)]
    spread = [r.servers > 1 for r in records if r.klass not in (BACKGROUND_COMPUTE, BACKGROUND_COMM)]
    return {"mean_jct_ms": 1e3 * float(jct.mean()), "p99_jct_ms": 1e3 * float(np.percentile(jct, 99)),
            "inference_mean_ms": 1e3 * float(inference.mean()),
            "inference_p99_ms": 1e3 * float(np.percentile(inference, 99)),
            "background_unqueued": float(np.mean([r.queued <= 1e-12 for r in background])) if background else np.nan,
            "distributed": float(np.mean(spread)), "jobs": float(len(records))}


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """Simulate the scenario under each policy (None: the scenario's ``policies``, else all)."""
    data = load_scenario(scenario_path)
    setup = parse(data)
    chosen = policy_names(data, policies, list(POLICIES))
    for p in chosen:
        choose(p, "policy", list(POLICIES))
    return report(setup, [run_policy(setup, p) for p in chosen])


def report(setup: Setup, outcomes: list[Outcome]) -> SimulationReport:
    """Per-policy table, ratios to Nona, and the flat summary (``nona_mean_jct_ms``, ``spark_vs_nona`` ...)."""
    rows = {o.policy: stats(o.records) for o in outcomes}
    base = rows.get("nona")
    table, summary = [], {}
    for o in outcomes:
        row = {"policy": o.policy, **rows[o.policy]}
        if np.isfinite(o.link_rho):
            row["link_rho"] = o.link_rho
        if base:
            row["mean_vs_nona"] = row["mean_jct_ms"] / base["mean_jct_ms"]
            row["p99_vs_nona"] = row["p99_jct_ms"] / base["p99_jct_ms"]
        if o.solution:
            row["predicted_rho"] = o.solution.prediction.rho
            row["decision_ms"] = 1e3 * o.solution.solve_s  # the offline solve: measured, not reproducible
        if o.q is not None:
            row["expert_q"] = o.q
        if o.table:
            row.update({f"table_{k}": v for k, v in o.table.items()})
        table.append(row)
        summary.update({f"{o.policy}_{k}": float(v) for k, v in row.items() if k != "policy"})
    c = setup.cluster
    params = {"servers": c.servers, "flops": c.nu, "link_gbps": c.mu / GBPS, "horizon_s": setup.workload.horizon_s,
              "warmup_s": setup.workload.warmup_s, "compute_queueing": c.compute_queueing,
              **{f"rate_{k}": v for k, v in setup.rates.items()}}
    summary.update({k: float(v) for k, v in params.items()})
    predicted = [{"policy": o.policy, "class": k, "rate": setup.rates[k],
                  "predicted_jct_ms": 1e3 * o.solution.prediction.jct[k],
                  "simulated_mean_ms": 1e3 * float(np.mean([r.jct for r in o.records if r.klass == k]))}
                 for o in outcomes if o.solution for k in setup.dags if any(r.klass == k for r in o.records)]
    return SimulationReport("nona", table, summary,
                            {"parameters": [{"name": k, "value": v} for k, v in params.items()],
                             "model vs simulation": predicted})


__all__ = ["Setup", "parse", "run", "run_policy", "report", "stats", "rates_for_load"]
