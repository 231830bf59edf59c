"""FLUID headline comparison (thesis Ch. 3, §3.4 and §3.6; figures F1–F10) in one seeded run.

Prints each figure beside the paper's number, writes PNG plots and (``--json``) a flat object of headline
figures. Everything is simulated (``gpu.sim.fluid.engine``): the paper's per-algorithm bars exist only as
figures, so only direction and rough size are comparable.

    python benchmarks/fluid.py [--quick] [--json OUT] [--plots DIR] [--seed N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks.cli import benchmark_parser, write_json
from benchmarks.paper_table import Row, print_beside_paper
from gpu.schedulers.fluid.algorithms import (FluidParams, Trial, lower_bound, max_parallelism, packing_limit, theorem1_bound,
                                  theorem2_bound)
from gpu.schedulers.fluid.controller import FluidExecutor
from gpu.schedulers.fluid.policies import build_executor
from gpu.sim.fluid.engine import RunResult, simulate
from gpu.sim.fluid.workload import Workload
from gpu.schedulers.fluid.tuning import (ASHA, BOHB, PBT, Choice, FixedTrials, GridSearch, Hyperband, LogUniform,
                                         SuccessiveHalving, SyncBOHB, TuningAlgorithm, Uniform)
from tasks.runtime.png import pyplot, save_png

PAPER_T32 = {2: (81.2, 2356), 4: (63.0, 1432), 8: (45.8, 1073), 16: (47.0, 475), 32: (25.2, 432)}
"""Table 3.2: successive halving without FLUID, workers -> (average utilisation %, runtime)."""
PAPER_F5 = {"grid": ("+10-70%", 1.1, 1.7), "hyperband": ("+30-100% (sync)", 1.3, 2.0),
            "syncbohb": ("+100% (2x; ours: +-25%)", 1.5, 2.5), "asha": ("+10-30% (async)", 1.1, 1.3),
            "bohb": ("+10-30% (async)", 1.1, 1.3), "pbt": ("limited (ours: < +30%)", 0.0, 1.3)}
"""§3.6 / Figs. 3.7-3.8, FLUID's speed-up per algorithm class: (as stated, lowest, highest speed-up that matches)."""
SIMULATED = "simulated trials all pack c per GPU, async ones too (the paper's bars: figure only)"
TOY = "the toy is fully specified: a bug"
SPACE = {"lr": LogUniform(1e-4, 1e-1), "momentum": Uniform(0.5, 0.99), "layers": Choice((2, 3, 4))}


def job(make: Callable[[], TuningAlgorithm], gpus: int, params: FluidParams, workload: Workload,
        policies=("fifo", "static_fluid", "fluid")) -> dict[str, RunResult]:
    return {p: simulate(p, make(), build_executor(p, gpus, params), workload, gpus, params.epsilon) for p in policies}


def toy() -> dict[str, float]:
    """F1: Fig. 3.5, budgets 4/4/12/30 s on 5 GPUs."""
    trials = [("a1", 4.0, {}), ("a2", 4.0, {}), ("a3", 12.0, {}), ("a4", 30.0, {})]
    res = job(lambda: FixedTrials(trials), 5, FluidParams(c=2, d=5), Workload())
    lb = lower_bound([Trial(t, b) for t, b, _ in trials], 5, 5)
    return {"toy_fifo_makespan_s": res["fifo"].makespan_s, "toy_static_fluid_makespan_s": res["static_fluid"].makespan_s,
            "toy_fluid_makespan_s": res["fluid"].makespan_s, "toy_lower_bound_s": lb}


def theorems(instances: int, rng: np.random.Generator) -> tuple[dict[str, float], list[float]]:
    """F2/F3: StaticFluid vs Theorem 1 (additive form) and Eq. 3.3 on random instances."""
    out = {"theorem1_violations": 0, "theorem2_violations": 0, "theorem1_pure_2x_holds": 0}
    ratios = []
    for i in range(instances):
        premise = i % 2 == 1
        n, k = int(rng.choice([4, 8, 16])), int(rng.integers(4, 101))
        c, d = int(rng.integers(1, 5)), int(rng.integers(1, n + 1))
        alpha = float(rng.uniform(1, c / (c - 1))) if premise and c > 1 else 1.0
        beta = float(rng.uniform(1, 1 + 1 / d)) if premise else 1.0
        budgets = rng.lognormal(2, 1, k)
        trials = [Trial(f"t{j}", float(b), alpha=alpha, beta=beta) for j, b in enumerate(budgets)]
        r = simulate("static", FixedTrials([(t.trial_id, t.budget, {}) for t in trials]),
                     FluidExecutor(list(range(n)), FluidParams(c, d), dynamic=False),
                     Workload(alpha=alpha, beta=beta), n)
        if premise:
            out["theorem2_violations"] += r.makespan_s >= theorem2_bound(trials, n, d)
        else:
            out["theorem1_violations"] += r.makespan_s >= theorem1_bound(trials, n, d)
            out["theorem1_pure_2x_holds"] += r.makespan_s < 2 * lower_bound(trials, n, d)
            ratios.append(r.makespan_s / lower_bound(trials, n, d))
    out["theorem1_pure_2x_holds"] /= max(1, len(ratios))
    out["theorem1_max_ratio_to_lb"] = max(ratios)
    out["theorem_instances"] = instances
    return out, ratios


def workload(seed: int, cv: float = 0.3, alpha: float = 1.25, beta: float = 1.1) -> Workload:
    return Workload(space=SPACE, seed=seed, iter_time_s=10.0, runtime_cv=cv, alpha=alpha, beta=beta, tau=20.0)


def sh_elasticity(seed: int, workers: list[int]) -> list[dict[str, float]]:
    """F4: successive halving without FLUID on 2..32 workers (Table 3.2 shape)."""
    rows = []
    for n in workers:
        r = job(lambda: SuccessiveHalving(SPACE, 64, max_budget=27, eta=2, seed=seed), n, FluidParams(), workload(seed),
                ("fifo",))["fifo"]
        rows.append({"workers": n, "utilisation": r.utilisation, "runtime_s": r.makespan_s})
    return rows


def per_algorithm(seed: int, quick: bool) -> dict[str, dict[str, RunResult]]:
    """F5: each algorithm on 8 GPUs with and without FLUID (c from alpha = 1.25, d from beta = 1.1)."""
    params = FluidParams(c=packing_limit(1.25), d=8, epsilon=2.0)
    samples = 27 if quick else 81
    algos = {
        "grid": lambda: GridSearch({**SPACE, "layers": Choice((2, 3, 4))}, budget=27, num_samples=9, seed=seed),
        "hyperband": lambda: Hyperband(SPACE, max_budget=27, eta=3, seed=seed),
        "syncbohb": lambda: SyncBOHB(SPACE, max_budget=27, eta=3, seed=seed),
        "asha": lambda: ASHA(SPACE, num_samples=samples, max_budget=27, eta=3, seed=seed),
        "bohb": lambda: BOHB(SPACE, num_samples=samples, max_budget=27, eta=3, seed=seed),
        "pbt": lambda: PBT(SPACE, population=8, interval=3, generations=9, seed=seed),
    }
    return {name: job(make, 8, params, workload(seed)) for name, make in algos.items()}


def grid_speedup(k: int, gpus: int, params: FluidParams, wl: Workload, seed: int) -> tuple[float, float, int]:
    """Speed-up of Static and Static+Dynamic FLUID over FIFO for a k-trial grid; max GPUs busy at once."""
    res = job(lambda: GridSearch(SPACE, budget=27, num_samples=k, seed=seed), gpus, params, wl)
    busy = max(b for _, b in res["fluid"].timeline)
    return res["fifo"].makespan_s / res["static_fluid"].makespan_s, res["fifo"].makespan_s / res["fluid"].makespan_s, busy


def micro(seed: int) -> dict[str, list[dict[str, float]]]:
    """F6–F10 microbenchmarks."""
    out: dict[str, list[dict[str, float]]] = {"F6": [], "F7": [], "F8": [], "F9": [], "F10": []}
    for alpha in (1.05, 1.4):
        for k in (9, 27, 81):
            p = FluidParams(c=packing_limit(alpha), d=1)
            out["F6"].append({"trials": k, "alpha": alpha, "c": p.c, "speedup": grid_speedup(k, 8, p, workload(seed, 0.3, alpha), seed)[1]})
    for beta in (1.05, 1.2):
        for k in (1, 2, 4):
            p = FluidParams(c=1, d=8)
            out["F7"].append({"trials": k, "beta": beta, "speedup": grid_speedup(k, 8, p, workload(seed, 0.0, 1.0, beta), seed)[1]})
    for cv in (0.0, 0.5, 1.0):
        s, f, _ = grid_speedup(9, 8, FluidParams(c=2, d=8, epsilon=2.0), workload(seed, cv), seed)
        out["F8"].append({"runtime_cv": cv, "static_speedup": s, "fluid_speedup": f})
    for slowdown in (1.5, 2.0, 10.0):
        p = FluidParams(c=packing_limit(slowdown), d=1)
        out["F9"].append({"pair_slowdown": slowdown, "alpha": slowdown, "c": p.c,
                          "speedup": grid_speedup(27, 8, p, workload(seed, 0.0, slowdown), seed)[1]})
    for beta in (1.1, 1.3):
        for n in (4, 8, 16):
            p = FluidParams(c=1, d=max_parallelism(beta, n))
            _, f, busy = grid_speedup(3, n, p, workload(seed, 0.0, 1.0, beta), seed)
            out["F10"].append({"gpus": n, "beta": beta, "d": p.d, "speedup": f, "max_gpus_busy": busy})
    return out


def plots(directory: Path, ratios: list[float], f4: list[dict], f5: dict[str, dict[str, RunResult]]) -> list[Path]:
    plt = pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].hist(ratios, bins=20)
    ax[0].axvline(2, color="r", ls="--", label="2 x LB")
    ax[0].set(title="F2: StaticFluid / lower bound (alpha = beta = 1)", xlabel="ratio", ylabel="instances")
    ax[0].legend()
    w = [r["workers"] for r in f4]
    ax[1].plot(w, [r["utilisation"] * 100 for r in f4], "o-", label="utilisation %")
    ax[1].set(xscale="log", xlabel="workers", title="F4: successive halving without FLUID")
    ax1b = ax[1].twinx()
    ax1b.plot(w, [r["runtime_s"] for r in f4], "s--r", label="runtime s")
    ax[1].legend(loc="upper center")
    names = list(f5)
    x = np.arange(len(names))
    for i, p in enumerate(("static_fluid", "fluid")):
        ax[2].bar(x + 0.4 * i, [f5[a]["fifo"].makespan_s / f5[a][p].makespan_s for a in names], 0.4, label=p)
    ax[2].axhline(1, color="k", lw=0.5)
    ax[2].set(xticks=x + 0.2, xticklabels=names, ylabel="speed-up vs FIFO", title="F5: 8 GPUs")
    ax[2].legend()
    fig.tight_layout()
    return [save_png(fig, directory / "fluid_headlines.png")]


def rows(figures: dict[str, float], f4: list[dict[str, float]], mic: dict[str, list[dict[str, float]]]) -> list[Row]:
    """Every figure beside the thesis's (F1-F10, §3.4, §3.6), judged by the thesis's own claim: the toy's exact
    makespans, the theorems' bounds, Table 3.2's trend, each algorithm class's range, the microbenchmarks' shapes."""
    fifo, static, fluid, lb = (figures[f"toy_{k}"] for k in ("fifo_makespan_s", "static_fluid_makespan_s",
                                                                "fluid_makespan_s", "lower_bound_s"))
    out = [Row("F1 toy FIFO makespan (s)", f"{fifo:.4g}", "30", abs(fifo - 30) < 0.5, "" if abs(fifo - 30) < 0.5 else TOY),
           Row("F1 toy StaticFluid makespan (s)", f"{static:.4g}", "12", abs(static - 12) < 0.5,
               "" if abs(static - 12) < 0.5 else TOY),
           Row("F1 toy Static+DynamicFluid makespan (s)", f"{fluid:.4g}", "near optimal (ours: <= 1.1 LB)",
               fluid <= 1.1 * lb, "" if fluid <= 1.1 * lb else TOY),
           Row("F1 toy lower bound sum(h)/n (s)", f"{lb:.4g}", why="inferred: the thesis gives no number"),
           Row("F2 Thm 1 (2 LB + max h1) violations", f"{figures['theorem1_violations']:.0f}", "0",
               figures["theorem1_violations"] == 0, "" if figures["theorem1_violations"] == 0 else "a bug"),
           Row("F2 share with StaticFluid < 2 LB", f"{figures['theorem1_pure_2x_holds']:.4g}", "1 (2-approx.)",
               figures["theorem1_pure_2x_holds"] == 1, "" if figures["theorem1_pure_2x_holds"] == 1 else "a bug"),
           Row("F2 worst StaticFluid / LB", f"{figures['theorem1_max_ratio_to_lb']:.3g}", "< 2",
               figures["theorem1_max_ratio_to_lb"] < 2, "" if figures["theorem1_max_ratio_to_lb"] < 2 else "a bug"),
           Row("F3 Eq. 3.3 violations", f"{figures['theorem2_violations']:.0f}", "0",
               figures["theorem2_violations"] == 0, "" if figures["theorem2_violations"] == 0 else "a bug")]
    first, last = f4[0], f4[-1]
    falls = last["utilisation"] < first["utilisation"]
    speedup = first["runtime_s"] / last["runtime_s"]
    workers = last["workers"] / first["workers"]
    p_first, p_last = PAPER_T32[first["workers"]], PAPER_T32[last["workers"]]
    out += [Row(f"F4 SH utilisation, {first['workers']:.0f} -> {last['workers']:.0f} workers",
                f"{first['utilisation']:.0%} -> {last['utilisation']:.0%}",
                f"{p_first[0]:.0f}% -> {p_last[0]:.0f}% (falls)", falls, "" if falls else SIMULATED),
            Row(f"F4 SH runtime speed-up, {workers:.0f}x the workers", f"{speedup:.2f}x",
                f"{p_first[1] / p_last[1]:.2f}x (not in proportion)", speedup < workers,
                "" if speedup < workers else SIMULATED)]
    for a, (stated, lo, hi) in PAPER_F5.items():
        f = figures[f"speedup_vs_fifo_{a}"]
        out.append(Row(f"F5 {a}: speed-up vs FIFO", f"{f:.2f}x (static "
                       f"{figures[f'static_speedup_vs_fifo_{a}']:.2f}x)", stated, lo <= f <= hi,
                       "" if lo <= f <= hi else SIMULATED))
    f6 = {(r["alpha"], r["trials"]): r["speedup"] for r in mic["F6"]}
    alphas, trials = sorted({a for a, _ in f6}), sorted({k for _, k in f6})
    small = [f6[alphas[0], k] for k in trials]
    ok6 = small == sorted(small) and f6[alphas[0], trials[-1]] > f6[alphas[-1], trials[-1]]
    out.append(Row(f"F6 {'/'.join(map(str, trials))} trials, alpha {alphas[0]:g} ({alphas[-1]:g})",
                   " / ".join(f"{f6[alphas[0], k]:.2f}x ({f6[alphas[-1], k]:.2f}x)" for k in trials),
                   "grows with #trials, small models", ok6, "" if ok6 else SIMULATED))
    f7 = {(r["beta"], r["trials"]): r["speedup"] for r in mic["F7"]}
    betas, trials = sorted({b for b, _ in f7}), sorted({k for _, k in f7})
    ok7 = all([f7[b, k] for k in trials] == sorted((f7[b, k] for k in trials), reverse=True) for b in betas)
    out.append(Row(f"F7 {'/'.join(map(str, trials))} trials, 8 GPUs, beta {'; '.join(f'{b:g}' for b in betas)}",
                   "; ".join(" / ".join(f"{f7[b, k]:.2f}x" for k in trials) for b in betas),
                   "grows with workers - trials gap", ok7,
                   "" if ok7 else "one trial gains less from 8 GPUs than two from 4 each: beta compounds with width"))
    f8 = [r["fluid_speedup"] for r in mic["F8"]]
    ok8 = f8 == sorted(f8)
    out.append(Row("F8 runtime CV " + "/".join(f"{r['runtime_cv']:g}" for r in mic["F8"]) + ": Static+Dynamic",
                   " / ".join(f"{v:.2f}x" for v in f8), "rises with variance (Dynamic)", ok8, "" if ok8 else SIMULATED))
    f9 = mic["F9"][-1]
    ok9 = abs(f9["speedup"] - 1) < 0.01
    out.append(Row(f"F9 pair slowdown {f9['pair_slowdown']:g}x: speed-up (c = {f9['c']})", f"{f9['speedup']:.2f}x",
                   "1.0 (packing off)", ok9, "" if ok9 else "Eq. 3.1 should give c = 1 here: a bug"))
    f10 = {(r["beta"], r["gpus"]): r for r in mic["F10"]}
    betas = sorted({b for b, _ in f10})
    helps = all(f10[b, 8]["speedup"] > f10[b, 4]["speedup"] for b in betas)
    idle = all(r["max_gpus_busy"] < r["gpus"] for r in mic["F10"] if 3 * r["d"] < r["gpus"])
    out.append(Row("F10 3 trials, 4 -> 8 GPUs, beta " + "; ".join(f"{b:g}" for b in betas),
                   "; ".join(f"{f10[b, 4]['speedup']:.2f} -> {f10[b, 8]['speedup']:.2f}x" for b in betas),
                   "4 -> 8 helps", helps, "" if helps else SIMULATED))
    out.append(Row("F10 ... GPUs busy of 16, d = " + " / ".join(f"{f10[b, 16]['d']}" for b in betas),
                   " / ".join(f"{f10[b, 16]['max_gpus_busy']}" for b in betas), "beyond d GPUs idle", idle,
                   "" if idle else "a trial spread wider than d: a bug"))
    return out


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__, "fewer random instances and samples", plots="fluid").parse_args(argv)
    t0 = time.time()
    rng = np.random.default_rng(args.seed)
    figures = toy()
    thm, ratios = theorems(60 if args.quick else 400, rng)
    figures.update(thm)
    f4 = sh_elasticity(args.seed, [2, 4, 8, 16, 32])
    f5 = per_algorithm(args.seed, args.quick)
    mic = micro(args.seed)

    print("FLUID (thesis Ch. 3) — simulated; paper numbers beside ours")
    print("\nF4 successive halving, no FLUID (Table 3.2: utilisation %, runtime)")
    for r in f4:
        u, rt = PAPER_T32[r["workers"]]
        print(f"  {r['workers']:>2} workers: util {r['utilisation'] * 100:5.1f}%  runtime {r['runtime_s']:7.0f} s"
              f"   paper {u:.1f}%  {rt}")
    print("\nF5 per algorithm, 8 GPUs: speed-up vs FIFO / launch-on-idle (static, static+dynamic), utilisation")
    for a, res in f5.items():
        fifo = res["fifo"]
        s, f = fifo.makespan_s / res["static_fluid"].makespan_s, fifo.makespan_s / res["fluid"].makespan_s
        figures[f"speedup_vs_fifo_{a}"] = f
        figures[f"static_speedup_vs_fifo_{a}"] = s
        figures[f"utilisation_fifo_{a}"] = fifo.utilisation
        figures[f"utilisation_fluid_{a}"] = res["fluid"].utilisation
        print(f"  {a:<10} {s:5.2f}x {f:5.2f}x   util {fifo.utilisation:4.0%} -> {res['fluid'].utilisation:4.0%}"
              f"   best loss {fifo.best_loss:.3f} / {res['fluid'].best_loss:.3f}")
    figures["speedup_vs_fifo"] = float(np.exp(np.mean([np.log(figures[f"speedup_vs_fifo_{a}"]) for a in f5])))
    for key, rows_ in mic.items():
        print(f"\n{key}")
        for r in rows_:
            print("  " + "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    figures["f9_speedup_10x_overhead"] = mic["F9"][-1]["speedup"]
    figures["f8_fluid_speedup_high_variance"] = mic["F8"][-1]["fluid_speedup"]
    print()
    print_beside_paper(rows(figures, f4, mic))
    for p in plots(args.plots, ratios, f4, f5):
        print(f"\nwrote {p}")
    figures["runtime_s"] = time.time() - t0
    write_json(args.json, figures)
    print(f"runtime {figures['runtime_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
