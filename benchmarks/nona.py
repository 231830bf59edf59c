"""Nona's evaluation (Pit-Claudel et al., §II, §III-D, §IV; Tables II–III, Figs. 1, 3–5) beside the paper's numbers.

The paper-shaped setup (§IV-A): 80 servers, one 10 Gbps bottleneck link, the five classes of Table II (GPT2,
DenseNet121, VGG16, AlexNet, ResNet18 as ``torch.fx`` graphs with every operator timed on this machine,
``gpu/sim/nona/profile_cpu.json``), background jobs at 100:1, loads 10–70 %. Schemes: Nona, Nona*, Expert,
Opportunistic, Random, Spark, and SJF-CP (a Decima-style list scheduler in Decima's place).

R1 contraction (Table II) · R2 search space · R3 PK wait vs the simulated link · R4 the §II example · R5 solve
time vs cluster size (Table III) · H the horizon and how unstable schemes' ratios grow with it · R6/R7 mean
JCT vs load (Fig. 3) · R8 link capacity sweep (Fig. 4) · R9 Nona* and ±40 % rate error (§IV-D) · R10 tails and
background jobs at 70 % load (Fig. 5) · the paper's equations vs ours with compute queueing · the lookup table
under a rate jump (§III-A) · the target (≥ 10× vs Random, ≥ 3× vs Spark) and why it is or is not met. Every
figure is printed beside the paper's with "reproduced" or "missed" and one line on any difference.

    python benchmarks/nona.py [--quick] [--json OUT] [--plots DIR]
"""

from __future__ import annotations

import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cli import benchmark_parser, write_json  # noqa: E402
from benchmarks.paper_table import Row, judged, print_beside_paper  # noqa: E402
from gpu.scenario import load_scenario  # noqa: E402
from gpu.schedulers.nona.optimizer import Cluster, NonaModel, QueryClass, solve  # noqa: E402
from gpu.schedulers.nona.dag import branches, contract, groupings, subgraphs  # noqa: E402
from gpu.schedulers.nona.controller import GroupingSampler  # noqa: E402
from gpu.sim.nona.run import GBPS, Outcome, Setup, model_for, parse, rates_for_load, run_policy, stats  # noqa: E402
from gpu.sim.nona.engine import BACKGROUND_COMM, BACKGROUND_COMPUTE, Workload, simulate  # noqa: E402
from gpu.sim.nona.workloads import load_profile, motivating_query, paper_models  # noqa: E402
from tasks.runtime.png import pyplot, save_png  # noqa: E402

TABLE_2 = {"gpt2": (178, 40), "densenet121": (429, 4), "vgg16": (41, 1), "alexnet": (23, 1), "resnet18": (71, 10)}
FIG_3A = {"spark": (32, 56), "opportunistic": (30, 180), "random": (70, 202), "sjf_cp": (139, 350)}  # all jobs
FIG_3B = {"spark": (28, 56), "opportunistic": (25, 111), "random": (59, 145), "sjf_cp": (59, 125)}  # inference
FIG_4 = {"spark": 22, "opportunistic": 60, "random": 70, "sjf_cp": 111}      # max ratio over the link sweep
FIG_5 = {"spark": 57, "opportunistic": 15, "random": 89, "sjf_cp": 58}       # inference p99 ratio at 70 % load
R1_WHY = {"densenet121": "PipeDream's DenseNet graph keeps 4 tasks; torch.fx's is a chain of concatenations",
          "gpt2": "PipeDream's GPT2 graph is not published; ours keeps ln_1 and q, k, v, attention per block"}
SCHEMES = ("spark", "sjf_cp", "opportunistic", "random", "undistributed", "expert", "nona_star")
PAPER_NAME = {"sjf_cp": "Decima"}  # SJF-CP is compared with the paper's Decima figures
TARGET = {"random": 10.0, "spark": 3.0}  # mean JCT ratio to Nona on the paper-shaped setup
TARGET_WHY = {"random": "Random saturates the link: its ratio is set by the horizon (H, why (2) above)",
              "spark": "Spark spreads less than Random: its link queue stays bounded (why (3) above)"}


def r1_contraction(rows: list[Row], out: dict, mu: float) -> None:
    print("R1 contraction (Table II), torch.fx graphs timed here; where branches are, their compute vs a transfer")
    print(f"  {'class':12s} {'before':>6s} {'after':>5s} {'rounds':>6s} {'paper':>10s} {'compute ms':>10s} "
          f"{'branchy subgraphs':>17s} {'saving/transfer ms':>19s}")
    for name, dag in paper_models().items():
        c = contract(dag)
        subs = [s for s in subgraphs(c.dag) if s.intermediates]
        saving, transfer = _branch_gain(c.dag, subs, mu)
        paper = TABLE_2[name]
        print(f"  {name:12s} {len(dag.tasks):6d} {len(c.dag.tasks):5d} {c.rounds:6d} {paper[0]:5d} → {paper[1]:2d} "
              f"{1e3 * dag.total_ops:10.1f} {len(subs):17d} "
              + (f"{1e3 * saving:9.2f} / {1e3 * transfer:5.2f}" if subs else f"{'—':>19s}"))
        out[f"r1_{name}_tasks_before"], out[f"r1_{name}_tasks_after"] = len(dag.tasks), len(c.dag.tasks)
        out[f"r1_{name}_compute_ms"] = 1e3 * dag.total_ops
        rows.append(judged(f"R1 {name} after contraction", str(len(c.dag.tasks)), str(paper[1]), len(c.dag.tasks) == paper[1],
                R1_WHY.get(name, "")))
    print("  (saving: the compute that running a subgraph's branches side by side saves, largest; transfer: one "
          "hand-off at μ)")
    about = load_profile()["about"]
    print(f"  profile: {about['measured']}\n  by `{about['command']}` on {about['cpu']}, torch {about['torch']}, "
          f"{about['date']}")


def _branch_gain(dag, subs, mu: float) -> tuple[float, float]:
    """The largest compute a subgraph saves by running its branches in parallel, and one of its hand-offs' time."""
    best, transfer = 0.0, 0.0
    for s in subs:
        times = [sum(dag.op[t] for t in b) for b in branches(dag, s)]
        if len(times) > 1 and sum(times) - max(times) > best:
            best = sum(times) - max(times)
            sizes = [b for (a, z), b in dag.bytes.items() if a == s.root and z in s.intermediates]
            transfer = float(np.mean(sizes)) / mu if sizes else 0.0
    return best, transfer


def r2_search_space(rows: list[Row], out: dict, servers: int) -> None:
    dags = [contract(d).dag for d in paper_models().values()]
    sizes = [len(groupings(s, servers)) for d in dags for s in subgraphs(d) if s.intermediates]
    out["r2_search_space"], out["r2_distributions"] = sum(sizes), len(sizes)
    print(f"\nR2 search space: Σ|Ω| = {sum(sizes)} over {len(sizes)} distributions; independent of the servers")
    rows.append(judged("R2 search space", f"{sum(sizes)} over {len(sizes)}", "46 over 9", (sum(sizes), len(sizes)) == (46, 9),
            "our GPT2 graph keeps 12 blocks of 5 intermediates (ln_1, q, k, v, attention): 471 groupings each"))


def r3_pk(rows: list[Row], out: dict, quick: bool) -> None:
    """Background transfers see the link's mean wait; compare with φ at four loads."""
    print("\nR3 PK formula vs the simulated FIFO link (mean wait of Poisson transfers, ms)")
    dag = contract(motivating_query()).dag
    theta = (0.5, 0, 0, 0, 0.5)
    worst = 0.0
    for rho in (0.3, 0.5, 0.7, 0.9):
        cluster = Cluster(80, 1000.0, 10e9, bg_comm_rate=(rho - 0.1) / 0.002, bg_comm_bytes=20e6)
        pred = NonaModel([QueryClass(dag, 100.0)], cluster).predict(np.array(theta, float))
        horizon = (40.0 if quick else 200.0) * (3 if rho >= 0.9 else 1)
        records = simulate(cluster, Workload({"f": (dag, 100.0)}, horizon, 5.0, seed=1),
                           GroupingSampler("t", {"f": dag}, {("f", "sum"): theta}, 80))
        sim = float(np.mean([r.queued for r in records if r.klass == BACKGROUND_COMM]))
        out[f"r3_rho{int(rho * 10)}_sim_over_pk"] = sim / pred.phi
        worst = max(worst, abs(sim / pred.phi - 1))
        print(f"  ρ = {pred.rho:.1f}: simulated {sim * 1e3:.3f}  PK φ {pred.phi * 1e3:.3f}  ratio {sim / pred.phi:.3f}"
              f"  (horizon {horizon:g} s)")
    rows.append(judged("R3 simulated wait / PK φ", f"within {worst:.0%}", "analytic (M/G/1)", worst < 0.1,
            "query transfers are not Poisson: a query's second transfer follows its first"))


def r4_motivating(rows: list[Row], out: dict, quick: bool) -> None:
    print("\nR4 §II example: 2 servers, 80 Gbps; JCT with no queueing (paper: 32 vs 14 ms, 22 undistributed)")
    dag = contract(motivating_query()).dag
    model = NonaModel([QueryClass(dag, 0.0)], Cluster(2, 1000.0, 10e9))
    omega = model.blocks[0].omega
    jct = {i: model.predict(np.eye(len(omega))[i]).jct["f"] * 1e3 for i in range(len(omega))}
    out["r4_allocation1_ms"], out["r4_allocation2_ms"], out["r4_undistributed_ms"] = jct[3], jct[0], jct[4]
    print(f"  allocation 1 (det remote) {jct[3]:.0f} ms, allocation 2 (sparse det remote) {jct[0]:.0f} ms, "
          f"undistributed {jct[4]:.0f} ms")
    rows.append(judged("R4 §II JCTs (ms)", f"{jct[3]:.0f} / {jct[0]:.0f} / {jct[4]:.0f}", "32 / 14 / 22",
            [round(jct[i]) for i in (3, 0, 4)] == [32, 14, 22]))
    print("  Table I: Nona's probability of distributing as background transfers load the link; simulated JCT (ms)")
    p = []
    for busy in (0.0, 0.3, 0.6, 0.8):
        cluster = Cluster(2, 1000.0, 10e9, bg_comm_rate=busy * 1000, bg_comm_bytes=10e6, compute_queueing=True)
        sol = solve(NonaModel([QueryClass(dag, 20.0)], cluster))
        theta = sol.thetas[("f", "sum")]
        wl = Workload({"f": (dag, 20.0)}, 30.0 if quick else 120.0, 5.0, seed=0)
        sims = {name: 1e3 * float(np.mean([r.jct for r in simulate(cluster, wl, GroupingSampler(
            name, {"f": dag}, {("f", "sum"): t}, 2)) if r.klass == "f"]))
            for name, t in (("nona", theta), ("always alloc. 2", (1, 0, 0, 0, 0)), ("never", (0, 0, 0, 0, 1)))}
        out[f"r4_busy{int(busy * 10)}_p_distribute"] = 1 - theta[4]
        p.append(1 - theta[4])
        print(f"  link busy {busy:.0%}: P(distribute) = {1 - theta[4]:.2f}; " +
              ", ".join(f"{k} {v:.1f}" for k, v in sims.items()))
    rows.append(judged("R4 P(distribute) 0→80 % busy", " ".join(f"{x:.2f}" for x in p), "falls with load (Table I)",
            all(a >= b for a, b in zip(p, p[1:])) and p[0] > p[-1]))


def r5_solve_time(rows: list[Row], out: dict, setup: Setup) -> None:
    print("\nR5 solve time vs cluster size (Table III: 13 s at every size on one EPYC core)")
    times = []
    for n in (16, 32, 64, 128):
        c = replace(setup.cluster, servers=n)
        rates = rates_for_load(setup.dags, 0.5, n, c.nu)
        t0 = time.perf_counter()
        solve(model_for(setup, rates, c), starts=setup.starts)
        times.append(time.perf_counter() - t0)
        out[f"r5_solve_s_n{n}"] = times[-1]
        print(f"  N = {n:3d}: {times[-1]:.2f} s")
    rows.append(judged("R5 solve time N = 16…128", f"{min(times):.1f}–{max(times):.1f} s", "13 s, flat", max(times) < 13,
            "seconds on a shared 2-core machine; larger clusters carry more traffic, so more iterations"))


def run_all(setup: Setup, quick: bool) -> dict[str, Outcome]:
    """Every scheme on one setup; Expert = the best of q ∈ grid (q = 0 and 1 are undistributed and
    Opportunistic exactly: the same per-query random streams)."""
    runs = {p: run_policy(setup, p) for p in ("nona", "nona_star", "opportunistic", "random", "spark", "sjf_cp",
                                              "undistributed")}
    candidates = {0.0: runs["undistributed"], 1.0: runs["opportunistic"]}
    for q in () if quick else setup.expert_grid:
        if q not in candidates:
            candidates[q] = run_policy(replace(setup, expert_grid=(q,)), "expert")
    q, best = min(candidates.items(), key=lambda kv: np.mean([r.jct for r in kv[1].records]))
    runs["expert"] = Outcome("expert", best.records, q=q, link_rho=best.link_rho)
    return runs


def _ratios(runs: dict[str, Outcome], key: str) -> dict[str, float]:
    base = stats(runs["nona"].records)[key]
    return {p: stats(o.records)[key] / base for p, o in runs.items()}


def _at(setup: Setup, load: float, horizon: float | None = None, mu: float | None = None) -> Setup:
    """The setup at compute ``load`` (every class the same rate), optionally another horizon or link."""
    s = replace(setup, rates=rates_for_load(setup.dags, load, setup.cluster.servers, setup.cluster.nu))
    bg = s.background_ratio * sum(s.rates.values())
    wl = replace(s.workload, classes={k: (d, s.rates[k]) for k, d in s.dags.items()})
    if horizon is not None:
        wl = replace(wl, horizon_s=horizon, warmup_s=horizon / 4)
    cluster = replace(s.cluster, bg_compute_rate=bg, bg_comm_rate=bg, mu=mu or s.cluster.mu)
    return replace(s, cluster=cluster, workload=wl)


def random_link_load(s: Setup) -> float:
    """ρ of the link when every task goes to a uniform server (Random): each edge crosses with probability
    1 − 1/N."""
    n = s.cluster.servers
    load = sum(s.rates[k] * sum(d.bytes.values()) for k, d in s.dags.items()) * (1 - 1 / n) / s.cluster.mu
    return load + s.cluster.bg_rho


def horizon_study(out: dict, setup: Setup, load: float, horizons: tuple[float, ...]) -> None:
    """The horizon: arrivals stop there and the run drains. Stable schemes' means settle; unstable ones grow."""
    print(f"\nH horizon at {load:.0%} load (warm-up a quarter of it): mean JCT ratio to Nona as arrivals run longer")
    print(f"  {'horizon':>7s} {'nona ms':>8s} " + " ".join(f"{p:>9s}" for p in ("random", "spark", "sjf_cp")))
    base = []
    for h in horizons:
        s = _at(setup, load, h)
        means = {p: stats(run_policy(s, p).records)["mean_jct_ms"] for p in ("nona", "random", "spark", "sjf_cp")}
        base.append(means["nona"])
        for p in ("random", "spark", "sjf_cp"):
            out[f"h{h:g}_{p}_over_nona"] = means[p] / means["nona"]
        print(f"  {h:6g}s {means['nona']:8.0f} " + " ".join(f"{means[p] / means['nona']:8.2f}×"
                                                              for p in ("random", "spark", "sjf_cp")))
    drift = abs(base[-1] / base[-2] - 1)
    out["h_nona_mean_drift"] = drift
    print(textwrap.fill(f"Nona's mean moves {drift:.1%} from {horizons[-2]:g} s to {horizons[-1]:g} s: the stable "
                        "schemes have settled; a scheme whose link is saturated (ρ ≥ 1) has a backlog that grows "
                        "with every second of arrivals, so its ratio is a function of the horizon, not a constant",
                        118, initial_indent="  ", subsequent_indent="  "))


def r6_load_sweep(rows: list[Row], out: dict, setup: Setup, loads: tuple[float, ...], quick: bool) -> dict:
    print(f"\nR6/R7 mean JCT ratio to Nona vs compute load (Fig. 3; 80 servers, 10 Gbps), all jobs (inference only)")
    print(f"  {'load':>4s} " + " ".join(f"{p:>13s}" for p in SCHEMES) + f" {'nona ms':>7s}")
    sweep = {}
    for load in loads:
        runs = run_all(_at(setup, load), quick)
        sweep[load] = runs
        all_r, inf_r = _ratios(runs, "mean_jct_ms"), _ratios(runs, "inference_mean_ms")
        for p in all_r:
            out[f"r6_load{int(load * 100)}_{p}_vs_nona"] = all_r[p]
            out[f"r7_load{int(load * 100)}_{p}_vs_nona"] = inf_r[p]
            out[f"r6_load{int(load * 100)}_{p}_link_rho"] = runs[p].link_rho
        print(f"  {load:4.1f} " + " ".join(f"{all_r[p]:5.2f} ({inf_r[p]:5.2f})" for p in SCHEMES)
              + f" {stats(runs['nona'].records)['mean_jct_ms']:7.0f}")
    print("  the link's measured utilisation ρ (busy share between warm-up and horizon; ≥ 1: a growing backlog)")
    print(f"  {'load':>4s} " + " ".join(f"{p:>13s}" for p in ("nona", *SCHEMES[:4])))
    for load in loads:
        print(f"  {load:4.1f} " + " ".join(f"{sweep[load][p].link_rho:13.2f}" for p in ("nona", *SCHEMES[:4])))
    for fig, paper, prefix in (("R6 (Fig. 3a)", FIG_3A, "r6"), ("R7 (Fig. 3b)", FIG_3B, "r7")):
        for p, (lo, hi) in paper.items():
            vals = [out[f"{prefix}_load{int(x * 100)}_{p}_vs_nona"] for x in loads]
            rho = [sweep[x][p].link_rho for x in loads]
            name = f"{fig} {PAPER_NAME.get(p, p)}/Nona" + (" (SJF-CP)" if p in PAPER_NAME else "")
            rows.append(judged(name, f"{min(vals):.2f}–{max(vals):.2f}×", f"{lo}–{hi}×", min(vals) >= lo,
                    _gap_reason(p, vals, rho, loads, out)))
    gap = max(abs(out[f"r6_load{int(x * 100)}_expert_vs_nona"] - 1) for x in loads)
    star = max(abs(out[f"r6_load{int(x * 100)}_nona_star_vs_nona"] - 1) for x in loads)
    out["r6_nona_vs_expert_max_gap"], out["r9_nona_star_max_gap"] = gap, star
    rows.append(judged("R6 Nona vs Expert", f"within {gap:.1%}", "within 10 %", gap <= 0.10))
    rows.append(judged("R9 Nona* vs Nona", f"within {star:.1%}", "within 15 %", star <= 0.15))
    return sweep


def _gap_reason(p: str, vals: list[float], rho: list[float], loads: tuple[float, ...], out: dict) -> str:
    """One line on why a baseline's ratio stays below the paper's, from the link load and horizon this run
    measured."""
    line = f"{p} kept the link at ρ = {min(rho):.2f}–{max(rho):.2f} over these loads"
    grows = [out[k] for k in sorted(out) if k.startswith("h") and k.endswith(f"_{p}_over_nona")]
    if p in ("spark", "sjf_cp") and grows and max(grows) < 1.5 * min(grows):
        line += ("; busy, yet its ratio does not grow with the horizon (H): once servers are busy the only free "
                 "one is often the parent's own, so live state stops spreading and the link's queue stays bounded")
    elif any(r >= 0.97 for r in rho):
        line += (f"; saturated from {min(x for x, r in zip(loads, rho) if r >= 0.97):.0%}, where its backlog grows "
                 "with every second of arrivals and its ratio with the horizon (H)")
    if any(r < 0.97 for r in rho):
        line += ("; below saturation the link adds a queue, not a backlog, to CPU-long queries (30–420 ms of "
                 "compute against 0.3–0.6 ms hand-offs at 10 Gbps)")
    behind = [x for x, v in zip(loads, vals) if v < 1]
    if behind:
        line += (f"; at {', '.join(f'{x:.0%}' for x in behind)} load {p} is ahead of Nona: idle servers everywhere, "
                 "and running branches side by side pays when no link queue forms (the paper has Nona ahead at "
                 "every load)")
    return line


def r8_bandwidth(rows: list[Row], out: dict, setup: Setup, links: tuple[float, ...], quick: bool) -> None:
    print("\nR8 link capacity sweep at 30 % compute load (Fig. 4)")
    best = {p: 0.0 for p in FIG_4}
    for gbps in links:
        runs = run_all(_at(setup, 0.3, mu=gbps * GBPS), quick)
        r = _ratios(runs, "mean_jct_ms")
        for p in FIG_4:
            best[p] = max(best[p], r[p])
            out[f"r8_link{gbps:g}_{p}_vs_nona"] = r[p]
            out[f"r8_link{gbps:g}_{p}_link_rho"] = runs[p].link_rho
        print(f"  {gbps:6g} Gbps: " + ", ".join(f"{p} {r[p]:.2f}×" for p in FIG_4)
              + f", expert {r['expert']:.2f}× (q = {runs['expert'].q})")
    for p, paper in FIG_4.items():
        rows.append(judged(f"R8 max {PAPER_NAME.get(p, p)}/Nona over links", f"{best[p]:.2f}×", f"{paper}×", best[p] >= paper,
                f"{p} at the slowest link, ρ = {out[f'r8_link{links[0]:g}_{p}_link_rho']:.2f}: saturated, its "
                "ratio grows with the horizon; on fast links the spread adds compute hops, not congestion"))


def r9_rate_error(rows: list[Row], out: dict, setup: Setup) -> None:
    print("\nR9 θ solved for rates off by ±40 %, run at the true rates (paper: robust up to ±40 %)")
    s = _at(setup, 0.3)
    true = stats(run_policy(s, "nona").records)["mean_jct_ms"]
    worst = 0.0
    for err in (0.6, 1.4):
        wrong = solve(model_for(s, {k: v * err for k, v in s.rates.items()}), starts=s.starts)
        placer = GroupingSampler("nona", s.dags, wrong.thetas, s.cluster.servers, s.workload.seed)
        got = stats(simulate(s.cluster, s.workload, placer))["mean_jct_ms"]
        out[f"r9_rates_x{err:g}_vs_nona"] = got / true
        worst = max(worst, abs(got / true - 1))
        print(f"  solved at {err:.1f}× the rates: mean JCT {got / true:.3f}× Nona's")
    rows.append(judged("R9 θ from rates off by ±40 %", f"within {worst:.1%}", "within 15 %", worst <= 0.15))


def r10_tails(rows: list[Row], out: dict, runs: dict[str, Outcome]) -> None:
    print("\nR10 tails at 70 % load (Fig. 5): inference p99 ratio to Nona; background jobs served unqueued")
    p99 = _ratios(runs, "inference_p99_ms")
    for p, paper in FIG_5.items():
        out[f"r10_{p}_inference_p99_vs_nona"] = p99[p]
        rows.append(judged(f"R10 {PAPER_NAME.get(p, p)} p99/Nona", f"{p99[p]:.2f}×", f"{paper}×", p99[p] >= paper,
                "Nona's own p99 is a VGG16 waiting behind others (one 0.4 s task): tails are compute, not the link"))
    share = {}
    for p in ("nona", "spark"):
        bg = [r for r in runs[p].records if r.klass in (BACKGROUND_COMPUTE, BACKGROUND_COMM)]
        share[p] = float(np.mean([r.queued <= 1e-12 for r in bg]))
        out[f"r10_{p}_background_unqueued"] = share[p]
    rows.append(judged("R10 background unqueued Nona vs Spark", f"{share['nona']:.0%} vs {share['spark']:.0%}", "≈40 % vs 1 %",
            share["nona"] > share["spark"]))


def paper_equations(out: dict, setup: Setup) -> None:
    print("\nCompute queueing: θ from the paper's equations (no compute queueing) vs with it, 30 % load, 100 Gbps")
    s = _at(setup, 0.3, mu=100 * GBPS)
    res = {}
    for queueing in (False, True):
        sol = solve(model_for(s, cluster=replace(s.cluster, compute_queueing=queueing)), starts=s.starts)
        placer = GroupingSampler("nona", s.dags, sol.thetas, s.cluster.servers, s.workload.seed)
        res[queueing] = stats(simulate(s.cluster, s.workload, placer))
    out["a7_paper_equations_vs_queueing"] = res[False]["mean_jct_ms"] / res[True]["mean_jct_ms"]
    print(f"  paper's equations: mean {res[False]['mean_jct_ms']:.0f} ms, {res[False]['distributed']:.0%} distributed; "
          f"with compute queueing: {res[True]['mean_jct_ms']:.0f} ms, {res[True]['distributed']:.0%} distributed")


def lookup_table(rows: list[Row], out: dict, quick: bool) -> None:
    print("\n§III-A lookup table: §II's query, 16 servers, 80 Gbps, rate 40 → 500 queries/s at 30 s")
    setup = parse(load_scenario(ROOT / "scenarios" / "nona" / "rate_shift.yaml"))
    if quick:
        setup = replace(setup, workload=replace(setup.workload, horizon_s=40.0))
    res = {p: run_policy(setup, p) for p in ("nona", "nona_table", "undistributed")}
    for p, o in res.items():
        st = stats(o.records)
        out[f"table_{p}_inference_mean_ms"] = st["inference_mean_ms"]
        extra = f"  ({o.table['resolves']:.0f} re-solve(s), {o.table['switches']:.0f} switch(es))" if o.table else ""
        print(f"  {p:14s} inference mean {st['inference_mean_ms']:8.1f} ms, p99 {st['inference_p99_ms']:8.1f} ms{extra}")
    rows.append(judged("§III-A table after a 12.5× rate jump", f"{out['table_nona_table_inference_mean_ms']:.0f} vs "
            f"{out['table_nona_inference_mean_ms']:.0f} ms (θ for the old rate)", "swapped without downtime",
            out["table_nona_table_inference_mean_ms"] < out["table_nona_inference_mean_ms"]))


def target(rows: list[Row], out: dict, setup: Setup, load: float, horizons: tuple[float, ...]) -> None:
    """The headline ratios on the paper-shaped setup, against the target, with the measured reason they fall
    short where they do."""
    print(f"\nTarget on the paper-shaped setup ({load:.0%} load, horizon {setup.workload.horizon_s:g} s): "
          "≥ 10× vs Random, ≥ 3× vs Spark")
    s = _at(setup, load)
    model = model_for(s)
    wait = model.residual(model.rates())
    saving = max(_branch_gain(d, [x for x in subgraphs(d) if x.intermediates], s.cluster.mu)[0]
                 for d in s.dags.values())
    key = int(load * 100)
    rho = {p: out[f"r6_load{key}_{p}_link_rho"] for p in TARGET}
    out["target_hop_wait_ms"], out["target_best_branch_saving_ms"] = 1e3 * wait, 1e3 * saving
    for p, goal in TARGET.items():
        got = out[f"nona_{p}_over_nona"]
        rows.append(judged(f"target {p}/Nona at {load:.0%} load", f"{got:.2f}× (link ρ = {rho[p]:.2f})",
                           f"target ≥ {goal:g}×", got >= goal, TARGET_WHY[p]))
    longest = 1e3 * max(d.total_ops for d in s.dags.values())
    print(textwrap.fill(
        f"why: (1) Nona is undistributed here: a part sent to another server waits W = {1e3 * wait:.1f} ms for the "
        f"task in service there (VGG16 is one {longest:.0f} ms task), more than the best branch saves "
        f"({1e3 * saving:.1f} ms, GPT2's q ∥ k ∥ v), so Nona's gain is the congestion it avoids, not parallelism. "
        f"(2) Random saturates the link (ρ = {rho['random']:.2f}), so its ratio is set by the horizon: "
        + ", ".join(f"{out[f'h{h:g}_random_over_nona']:.1f}× at {h:g} s" for h in horizons)
        + " of arrivals (H). (3) Spark's fair scheduler puts a ready task on a free server, which on a busy "
        f"cluster is often the parent's own: it spreads less than Random, so although the link is busy (ρ = "
        f"{rho['spark']:.2f}) its queue stays bounded and its ratio does not grow with the horizon ("
        + ", ".join(f"{out[f'h{h:g}_spark_over_nona']:.2f}×" for h in horizons)
        + "); our CPU-long queries (30–420 ms) dwarf a 0.3–0.6 ms hand-off.",
        118, initial_indent="  ", subsequent_indent="      "))


def _plots(sweep: dict, folder: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    loads = sorted(sweep)
    for p in ("nona", "nona_star", "expert", "spark", "sjf_cp", "opportunistic", "random", "undistributed"):
        ax.plot(loads, [stats(sweep[x][p].records)["mean_jct_ms"] for x in loads], marker="o", label=p)
    ax.set(xlabel="compute load", ylabel="mean JCT (ms)", yscale="log", title="Nona, Fig. 3-style load sweep")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, folder / "fig3_load_sweep.png", dpi=120)


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__, "shorter horizons, fewer loads and links", seed=None,
                            plots="nona").parse_args(argv)
    t0 = time.time()
    setup = parse(load_scenario(ROOT / "scenarios" / "nona" / "paper_80.yaml"))
    horizon = 8.0 if args.quick else 30.0
    setup = replace(setup, workload=replace(setup.workload, horizon_s=horizon, warmup_s=horizon / 4),
                    expert_grid=(0.0, 1.0) if args.quick else (0.0, 0.25, 0.5, 0.75, 1.0))
    load = float(load_scenario(ROOT / "scenarios" / "nona" / "paper_80.yaml")["load"])
    print("80 servers as fast as one core here (ν = 1, ops in measured s), μ = 10 Gbps, background 100:1"
          + ("  [--quick]" if args.quick else ""))
    print(f"horizon {horizon:g} s of arrivals, then the run drains; warm-up {horizon / 4:g} s")
    print("  horizon: the paper states none; ours is long enough that Nona's mean settles (H below: it moves a few % "
          "as the horizon\n  doubles), and every ratio is reported at it: a scheme that saturates the link has "
          "a ratio that grows with it")
    out: dict[str, float] = {"horizon_s": horizon, "paper_load": load}
    rows: list[Row] = []
    r1_contraction(rows, out, setup.cluster.mu)
    r2_search_space(rows, out, setup.cluster.servers)
    r3_pk(rows, out, args.quick)
    r4_motivating(rows, out, args.quick)
    r5_solve_time(rows, out, setup)
    horizons = (4.0, 8.0, 16.0) if args.quick else (8.0, 15.0, 30.0, 60.0)
    horizon_study(out, setup, load, horizons)
    loads = (0.1, 0.5, 0.7) if args.quick else (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
    sweep = r6_load_sweep(rows, out, setup, loads, args.quick)
    key = int(load * 100)
    out["nona_random_over_nona"] = out[f"r6_load{key}_random_vs_nona"]
    out["nona_spark_over_nona"] = out[f"r6_load{key}_spark_vs_nona"]
    out["nona_sjf_cp_over_nona"] = out[f"r6_load{key}_sjf_cp_vs_nona"]
    r8_bandwidth(rows, out, setup, (1.0, 100.0) if args.quick else (1.0, 2.5, 10.0, 40.0, 100.0), args.quick)
    r9_rate_error(rows, out, setup)
    r10_tails(rows, out, sweep[0.7])
    paper_equations(out, setup)
    lookup_table(rows, out, args.quick)
    figures = list(rows)  # the paper's figures; the targets below are ours
    target(rows, out, setup, load, horizons)
    print("\nSummary: ours beside the paper")
    print_beside_paper(rows)
    _plots(sweep, args.plots)
    out["reproduced"], out["figures"] = sum(r.reproduced is True for r in figures), len(figures)
    out["total_s"] = time.time() - t0
    print(f"\nplots in {args.plots}; total {out['total_s']:.0f} s")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
