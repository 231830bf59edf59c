"""``gpuflows simulate escher SCENARIO``: ESCHER's evaluation (thesis §4.6) on the simulated cluster.

Each "policy" is one of the paper's ESL experiments, run with the real ESLs of
``gpu.schedulers.escher.api*`` on ``gpu.sim.escher.world.World`` (an ``EventLoop`` clock and the
``SimLedger`` scheduler, matching through ``gpu.placement``):

=============  =================================================================  =========
``affinity``   serving replicas apart, consumers on their producers' nodes          Table 4.2
``gang``       AppSpace / LibSpace / FrameSpace gang latency                      Fig. 4.7
``locality``   WordCount, random vs native locality vs the two-line ESCHER change  Fig. 4.5a/b
``hfs``        hierarchical fair sharing, users arriving at 0/60/120 s             Fig. 4.5c
``colocation`` AlphaZero predictor/aggregator pairs, hard-coded vs ESCHER vs none  Fig. 4.6b
``tune``       EscherTune migrating a spread job once one node has room            Fig. 4.6c
=============  =================================================================  =========

The scenario format is in ``docs/escher.md``; ``scenarios/escher/paper.yaml`` is the shipped example.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.devices import MAX_SIMULATED
from gpu.scenario import (
    MAX_FACTOR, MAX_MS, MAX_RATE, MAX_SECONDS, MAX_SEED, entries, integer, known_fields, label, load_scenario,
    policy_names, positive, section, within_events,
)
from gpu.schedulers.escher.policies import POLICIES
from gpu.sim.escher.affinity import PLACEMENTS, Affinity, affinity_placements
from gpu.sim.escher.gangs import GangLoad, gang_latencies
from gpu.sim.escher.workloads import (
    TRANSFER_SHARE, AlphaZero, FairShare, Tune, WordCount, alphazero_placements, calibrate_penalty,
    exploration_latencies, fair_share, link_bandwidth, tune, wordcount,
)
from gpu.sim.escher.world import Timing

SCENARIO_KEYS = {"name", "seed", "timing", "policies", *POLICIES}
MAX_NODES = 1000
MAX_CPUS = 10_000  # CPUs of one simulated node
MAX_TASKS = 100_000  # gangs, pairs, explorations of one experiment
MAX_GB = 1_000_000.0  # a petabyte of WordCount input
MAX_GB_S = 100_000.0  # a node's bandwidth: 100 TB/s


def _numbers(value: Any, field: str, minimum: float = 0.0, upper: float = MAX_SECONDS) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(field, value, "must be a non-empty list of numbers")
    out = tuple(positive(v, f"{field}[{i}]", upper=upper) for i, v in enumerate(value))
    if min(out) < minimum:
        raise ConfigError(field, value, f"every entry must be >= {minimum}")
    return out


def _nodes(value: Any, field: str) -> int:
    n = integer(value, field, minimum=1)
    if n > MAX_NODES:
        raise ConfigError(field, value, f"at most {MAX_NODES} nodes")
    return n


def _timing(raw: Any) -> Timing:
    t = section(raw, "timing", {"schedule_s", "schedule_sigma", "set_resource_s"})
    d = Timing()
    return Timing(positive(t.get("schedule_s", d.schedule), "timing.schedule_s", upper=MAX_SECONDS),
                  positive(t.get("schedule_sigma", d.schedule_sigma), "timing.schedule_sigma", allow_zero=True,
                           upper=10.0),
                  positive(t.get("set_resource_s", d.set_resource), "timing.set_resource_s", allow_zero=True,
                           upper=MAX_SECONDS))


def _affinity(raw: Any) -> Affinity:
    a = section(raw, "affinity", {"nodes", "cpus", "replicas", "pairs", "task_s"})
    d = Affinity()
    out = Affinity(_nodes(a.get("nodes", d.nodes), "affinity.nodes"),
                   integer(a.get("cpus", d.cpus), "affinity.cpus", minimum=2, maximum=MAX_CPUS),
                   integer(a.get("replicas", d.replicas), "affinity.replicas", minimum=1),
                   integer(a.get("pairs", d.pairs), "affinity.pairs", minimum=1, maximum=MAX_TASKS),
                   positive(a.get("task_s", d.task_s), "affinity.task_s", upper=MAX_SECONDS))
    if out.replicas > out.nodes:
        raise ConfigError("affinity.replicas", out.replicas, f"anti-affine replicas need a node each; there are {out.nodes}")
    return out


def _gang(raw: Any) -> GangLoad:
    g = section(raw, "gang", {"nodes", "cpus", "gangs", "sizes", "arrival_rate", "run_s", "timeout_s", "backoff_s"})
    d = GangLoad()
    nodes = _nodes(g.get("nodes", d.nodes), "gang.nodes")
    cpus = integer(g.get("cpus", d.cpus), "gang.cpus", minimum=1, maximum=MAX_CPUS)
    sizes = tuple(int(integer(s, "gang.sizes", minimum=1)) for s in _numbers(g.get("sizes", d.sizes), "gang.sizes", 1,
                                                                                upper=MAX_NODES * MAX_CPUS))
    if max(sizes) > nodes * cpus:
        raise ConfigError("gang.sizes", list(sizes), f"a gang larger than the cluster's {nodes * cpus} CPUs never runs")
    return GangLoad(nodes, cpus, integer(g.get("gangs", d.gangs), "gang.gangs", minimum=1, maximum=MAX_TASKS), sizes,
                    positive(g.get("arrival_rate", d.arrival_rate), "gang.arrival_rate", upper=MAX_RATE),
                    positive(g.get("run_s", d.run_s), "gang.run_s", upper=MAX_SECONDS),
                    positive(g.get("timeout_s", d.timeout), "gang.timeout_s", upper=MAX_SECONDS),
                    positive(g.get("backoff_s", d.backoff), "gang.backoff_s", upper=MAX_SECONDS))


def _locality(raw: Any) -> WordCount:
    w = section(raw, "locality", {"nodes", "input_gb", "cluster_sizes", "compute_s_per_gb", "bandwidth_gb_s"})
    d = WordCount()
    sizes = tuple(_nodes(n, "locality.cluster_sizes") for n in w.get("cluster_sizes", d.cluster_sizes))
    if not sizes or min(sizes) < 2:
        raise ConfigError("locality.cluster_sizes", list(sizes), "needs cluster sizes of at least 2 nodes")
    bw = w.get("bandwidth_gb_s")
    return WordCount(_nodes(w.get("nodes", d.nodes), "locality.nodes"), _numbers(w.get("input_gb", d.input_gb),
                     "locality.input_gb", upper=MAX_GB), sizes,
                     positive(w.get("compute_s_per_gb", d.compute_s_per_gb), "locality.compute_s_per_gb",
                              upper=MAX_SECONDS),
                     None if bw is None else positive(bw, "locality.bandwidth_gb_s", upper=MAX_GB_S))


def _hfs(raw: Any) -> FairShare:
    h = section(raw, "hfs", {"nodes", "task_s", "warmup_s", "period_s", "horizon_s", "users"})
    d = FairShare()
    users = tuple((label(u["id"], f"hfs.users[{i}].id"), label(u.get("team", "root-team"), f"hfs.users[{i}].team"),
                   positive(u.get("weight", 1.0), f"hfs.users[{i}].weight", upper=MAX_FACTOR),
                   positive(u.get("arrives_s", 0.0), f"hfs.users[{i}].arrives_s", allow_zero=True, upper=MAX_SECONDS))
                  for i, u in enumerate(entries(h.get("users"), "hfs.users", {"id", "team", "weight", "arrives_s"})))
    if h.get("users") is not None and not users:
        raise ConfigError("hfs.users", h.get("users"), "name at least one user")
    if len({u[0] for u in users}) != len(users):
        raise ConfigError("hfs.users", [u[0] for u in users], "user ids must be unique")
    out = FairShare(_nodes(h.get("nodes", d.nodes), "hfs.nodes"),
                    positive(h.get("task_s", d.task_s), "hfs.task_s", upper=MAX_SECONDS),
                    positive(h.get("warmup_s", d.warmup_s), "hfs.warmup_s", allow_zero=True, upper=MAX_SECONDS),
                    positive(h.get("period_s", d.period_s), "hfs.period_s", upper=MAX_SECONDS),
                    positive(h.get("horizon_s", d.horizon_s), "hfs.horizon_s", upper=MAX_SECONDS), users or d.arrivals)
    within_events(out.horizon_s / out.task_s * out.nodes, "hfs.horizon_s", out.horizon_s,
                  "tasks (horizon_s / task_s x nodes)")
    within_events(out.horizon_s / out.period_s, "hfs.period_s", out.period_s, "samples (horizon_s / period_s)")
    return out


def _colocation(raw: Any) -> AlphaZero:
    a = section(raw, "colocation", {"nodes", "pairs", "explorations", "compute_ms", "median_gain"})
    d = AlphaZero()
    out = AlphaZero(_nodes(a.get("nodes", d.nodes), "colocation.nodes"),
                    integer(a.get("pairs", d.pairs), "colocation.pairs", minimum=1),
                    integer(a.get("explorations", d.explorations), "colocation.explorations", minimum=1,
                            maximum=MAX_TASKS),
                    positive(a.get("compute_ms", d.compute_ms), "colocation.compute_ms", upper=MAX_MS),
                    d.compute_sigma, positive(a.get("median_gain", d.median_gain), "colocation.median_gain",
                                              upper=MAX_FACTOR))
    within_events(out.pairs * out.explorations, "colocation.explorations", out.explorations,
                  "explorations (pairs x explorations)")
    if out.pairs > 4 * out.nodes:
        raise ConfigError("colocation.pairs", out.pairs, f"at most 4 per node ({4 * out.nodes}): a predictor takes a GPU")
    return out


def _tune(raw: Any) -> Tune:
    t = section(raw, "tune", {"nodes", "gpus_per_node", "short_s", "long_gpus", "horizon_s", "poll_s", "checkpoint_s"})
    d = Tune()
    out = Tune(_nodes(t.get("nodes", d.nodes), "tune.nodes"),
               integer(t.get("gpus_per_node", d.gpus_per_node), "tune.gpus_per_node", minimum=1,
                       maximum=MAX_SIMULATED),
               _numbers(t.get("short_s", d.short_s), "tune.short_s"),
               integer(t.get("long_gpus", d.long_gpus), "tune.long_gpus", minimum=1),
               positive(t.get("horizon_s", d.horizon_s), "tune.horizon_s", upper=MAX_SECONDS),
               positive(t.get("poll_s", d.poll_s), "tune.poll_s", upper=MAX_SECONDS),
               positive(t.get("checkpoint_s", d.checkpoint_s), "tune.checkpoint_s", allow_zero=True,
                        upper=MAX_SECONDS))
    within_events(out.horizon_s / out.poll_s, "tune.poll_s", out.poll_s, "polls (horizon_s / poll_s)")
    if out.long_gpus > out.gpus_per_node:
        raise ConfigError("tune.long_gpus", out.long_gpus, "a job wider than a node can never be co-located")
    return out


# -- experiments ------------------------------------------------------------------------------------
def run_affinity(load: Affinity, timing: Timing, seed: int) -> tuple[dict[str, float], list[dict]]:
    rows = [{"placement": p, **affinity_placements(load, p, timing, seed)} for p in PLACEMENTS]
    return {f"affinity_{r['placement']}_{k}": float(r[k]) for r in rows
            for k in ("replica_spread", "colocated_share", "consumer_delay_ms")}, rows


def run_gang(load: GangLoad, timing: Timing, seed: int) -> tuple[dict[str, float], list[dict]]:
    lat = {k: np.array(v) * 1000 for k, v in gang_latencies(load, timing, seed).items()}
    rows = [{"design": k, "gangs": len(v), "mean_ms": v.mean(), "min_ms": v.min(), "p50_ms": np.median(v),
             "p99_ms": np.percentile(v, 99), "max_ms": v.max()} for k, v in lat.items()]
    summary = {f"gang_{r['design']}_{m}": float(r[m]) for r in rows for m in ("mean_ms", "min_ms", "p99_ms", "max_ms")}
    summary["gang_framespace_speedup"] = float((lat["appspace"].mean() + lat["libspace"].mean()) / 2
                                               / lat["framespace"].mean())
    return summary, rows


def run_locality(load: WordCount, timing: Timing, seed: int) -> tuple[dict[str, float], list[dict]]:
    rows = []
    bw = link_bandwidth(load, load.nodes)
    for gb in load.input_gb:
        r = {p: wordcount(load, p, gb, load.nodes, bw, timing, seed) for p in ("random", "native", "escher")}
        rows.append({"nodes": load.nodes, "input_gb": gb, **{f"{p}_makespan_s": r[p]["makespan_s"] for p in r},
                     "random_transfer_share": r["random"]["transfer_share"]})
    for n in load.cluster_sizes:
        gb = max(load.input_gb) * n / load.nodes            # the same data per node at every scale
        bw_n = link_bandwidth(WordCount(n, (gb,), (), load.compute_s_per_gb, load.bandwidth_gb_s), n)
        r = {p: wordcount(load, p, gb, n, bw_n, timing, seed) for p in ("native", "escher")}
        rows.append({"nodes": n, "input_gb": gb, **{f"{p}_makespan_s": r[p]["makespan_s"] for p in r}})
    gaps = [100 * (row["escher_makespan_s"] / row["native_makespan_s"] - 1) for row in rows]
    top = max(rows[: len(load.input_gb)], key=lambda row: row["input_gb"])
    return {"locality_transfer_share_pct": 100 * top["random_transfer_share"],
            "locality_escher_vs_native_max_gap_pct": max(gaps),
            "locality_random_slowdown": top["random_makespan_s"] / top["native_makespan_s"],
            "locality_bandwidth_gb_s": bw}, rows


def run_hfs(load: FairShare, timing: Timing, seed: int) -> tuple[dict[str, float], list[dict]]:
    samples = fair_share(load, timing, seed)
    users = [u for u, *_ in load.arrivals]
    arrivals = sorted({t for *_, t in load.arrivals} | {load.horizon_s})
    summary: dict[str, float] = {}
    for start, end in zip(arrivals, arrivals[1:]):
        at = max((s for s in samples if s["t"] <= end - 1), key=lambda s: s["t"])      # settled, just before the next
        for u in users:
            summary[f"hfs_{u}_nodes_before_{end:g}s"] = at[u]
    for start in arrivals[1:-1]:
        window = [s["net_throughput"] for s in samples if start <= s["t"] <= start + 3 * load.task_s]
        summary[f"hfs_net_throughput_min_after_{start:g}s"] = min(window) if window else float("nan")
    return summary, [s for s in samples if s["t"] % 5 == 0]


def run_colocation(load: AlphaZero, timing: Timing, seed: int) -> tuple[dict[str, float], list[dict]]:
    placed = {p: alphazero_placements(load, p, timing, seed) for p in ("hardcoded", "escher", "none")}
    penalty = calibrate_penalty(load, placed["none"][0], seed)
    lat = {p: exploration_latencies(load, placed[p][0], penalty, seed) for p in placed}
    rows = [{"placement": p, "colocated_pairs": placed[p][0], "placed_by_s": placed[p][1],
             "median_ms": float(np.median(lat[p])), "p95_ms": float(np.percentile(lat[p], 95))} for p in placed]
    by = {r["placement"]: r for r in rows}
    return {"colocation_median_gain_pct": 100 * (1 - by["escher"]["median_ms"] / by["none"]["median_ms"]),
            "colocation_p95_gain_pct": 100 * (1 - by["escher"]["p95_ms"] / by["none"]["p95_ms"]),
            "colocation_ephemeral_overhead_pct": 100 * (by["escher"]["median_ms"] / by["hardcoded"]["median_ms"] - 1),
            "colocation_escher_colocated_share": by["escher"]["colocated_pairs"] / load.pairs,
            "colocation_penalty_ms": penalty}, rows


def run_tune(load: Tune, timing: Timing, seed: int) -> tuple[dict[str, float], list[dict]]:
    r = {"tune": tune(load, False, timing, seed), "eschertune": tune(load, True, timing, seed)}
    rows = [{"system": k, **v} for k, v in r.items()]
    return {"tune_throughput_gain_pct": 100 * (r["eschertune"]["final_rate"] / r["tune"]["final_rate"] - 1),
            "tune_work_gain_pct": 100 * (r["eschertune"]["long_work"] / r["tune"]["long_work"] - 1),
            "tune_migrated_at_s": r["eschertune"]["migrated_at_s"],
            "tune_long_job_nodes_after": r["eschertune"]["long_nodes_at_end"]}, rows


EXPERIMENTS: dict[str, tuple[Callable[[Any], Any], Callable[..., tuple[dict[str, float], list[dict]]]]] = {
    "affinity": (_affinity, run_affinity), "gang": (_gang, run_gang), "locality": (_locality, run_locality), "hfs": (_hfs, run_hfs),
    "colocation": (_colocation, run_colocation), "tune": (_tune, run_tune),
}


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """Run the scenario's experiments (``policies``, default all in the scenario) and report them."""
    data = load_scenario(scenario_path)
    known_fields(data, SCENARIO_KEYS, "")
    chosen = policy_names(data, policies, [p for p in POLICIES if p in data] or list(POLICIES))
    for p in chosen:
        if p not in EXPERIMENTS:
            raise ConfigError("policy", p, f"unknown; choose from {list(POLICIES)}")
    seed = integer(data.get("seed", 0), "seed", minimum=0, maximum=MAX_SEED)
    timing = _timing(data.get("timing"))
    parsed = {p: EXPERIMENTS[p][0](data.get(p)) for p in chosen}           # every check before any work
    summary: dict[str, float] = {}
    tables: dict[str, list[dict]] = {}
    for p in chosen:
        figures, rows = EXPERIMENTS[p][1](parsed[p], timing, seed)
        summary.update(figures)
        tables[p] = rows
    table = [{"figure": k, "value": v, "paper": PAPER.get(k, "")} for k, v in summary.items()]
    return SimulationReport("escher", table, summary, tables)


PAPER: dict[str, str] = {
    "affinity_escher_replica_spread": "1 (Table 4.2: one replica per node)",
    "affinity_escher_colocated_share": "1 (Table 4.2: T2 on T1's node)",
    "gang_framespace_speedup": "~2x (Fig. 4.7)",
    "gang_appspace_max_ms": "< 1000, widest tail",
    "gang_libspace_min_ms": "highest minimum",
    "locality_transfer_share_pct": f"{100 * TRANSFER_SHARE:.1f} (calibrated unless locality.bandwidth_gb_s is set)",
    "locality_escher_vs_native_max_gap_pct": "<= 1.9",
    "colocation_median_gain_pct": "15.4 (calibrated: the split pairs' board-transfer penalty is fitted to it)",
    "colocation_p95_gain_pct": "20 (ours rests on the calibrated penalty)",
    "colocation_ephemeral_overhead_pct": "< 1",
    "tune_throughput_gain_pct": "36.3 (calibrated: the spread slowdown is set to 1.363)",
}
"""The paper's number beside each figure of ours that it has one for."""
