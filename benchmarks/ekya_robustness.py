"""Ekya robustness evaluations on the trace-driven simulator (thesis §2.4 and §2.6, Fig. 2.11b).

Three perturbations of what the thief scheduler is told, each against the uniform baselines that do
not consult the profiles (docs/ekya.md, "Robustness evaluations"):

- **Micro-profiler estimation error** (§2.6, Fig. 2.11b): Gaussian noise of standard deviation
  ``sigma`` (accuracy points) is added to every retraining config's *estimated* accuracy when the
  thief queries the profiles; the simulator still deploys the config's true accuracy. The paper:
  "with up to 20% error ... the maximum accuracy drop is 3%".
- **Profiled cost error** (§2.4: the micro-profiler also predicts each config's GPU cost): the thief sees
  every config's GPU-seconds times ``1 + N(0, sigma)``; retraining then takes the true time.
- **Profiling cost** (§2.4 "Micro-profiling design": micro-profiling is 100x cheaper than profiling
  every config on all the data): each window, a stream's retraining job first pays ``cost_factor``
  times the GPU-seconds of all its configs (0.01 = micro-profiling, 1.0 = exhaustive, 100x more).
- **Annotation delay** (§2.4 "Annotating training data"; the cloud-retraining comparison of
  Table 2.3 is the same effect): labels arrive ``delay_s`` into the window. As the paper does, the
  delay is subtracted from the window passed to the scheduler, and a retraining job deploys only
  after the delay plus its training time (uniform baselines wait for the labels too).
- **Cloud retraining** (§2.6 "Ekya vs. Cloud-based retraining", Table 2.3): 8 streams, 4 GPUs, 400 s
  windows; the edge GPUs only serve inference, every stream's best config retrains "instantaneously"
  in the cloud, and its model is deployed once the window's training data (160 Mb per camera) has
  gone up and the models (398 Mb each) have come back one after another, as the paper counts it.

    python benchmarks/ekya_robustness.py [--quick] [--json OUT] [--seed N]
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpu.schedulers.ekya.thief import EkyaDecision, RetrainConfig  # noqa: E402
from gpu.schedulers.ekya.policies import EkyaPolicy, make_policy  # noqa: E402
from gpu.sim.ekya.run import simulate_policy  # noqa: E402
from gpu.sim.ekya.scenario import EkyaScenario, ScenarioStream, WindowSpec  # noqa: E402
from gpu.sim.ekya.workloads import generate  # noqa: E402
from benchmarks.cli import benchmark_parser, finish  # noqa: E402
from benchmarks.paper_table import Row, print_beside_paper  # noqa: E402

UNIFORM = ("uniform_cfg1_50", "uniform_cfg2_50", "uniform_cfg2_90", "uniform_cfg2_30", "uniform_cfg1_90")
STREAMS, GPUS = 8, 4.0  # Table 2.3's setup: 8 videos on 4 GPUs
ERRORS = (0.0, 0.05, 0.10, 0.20)
COST_ERRORS = (0.1, 0.2, 0.5)
COST_FACTORS = {"micro": 0.01, "exhaustive": 1.0}
DELAYS_S = (0.0, 25.0, 50.0, 100.0)
CLOUD_WINDOW_S, UPLOAD_MB, MODEL_MB = 400.0, 160.0, 398.0  # §2.6: 400 s windows, per-camera data, ResNet18
LINKS_MBPS = {"cellular": (5.1, 17.5), "satellite": (8.5, 15.0), "cellular_2x": (10.2, 35.0)}  # Table 2.3


def run_policy(scenario: EkyaScenario, policy: EkyaPolicy) -> float:
    """Mean inference accuracy of ``policy`` over every stream and window of ``scenario``."""
    return simulate_policy(scenario, policy).mean_accuracy


def told_thief(scenario: EkyaScenario, estimate: dict[RetrainConfig, RetrainConfig], name: str) -> EkyaPolicy:
    """The thief deciding from ``estimate`` (true config -> the profiler's estimate of it).

    Retraining then takes the config's *true* GPU-seconds: a job whose cost was under-estimated may not
    finish inside the window (the simulator discards it), one over-estimated finishes early.
    """
    thief, alpha = make_policy("thief", scenario), scenario.params.retrain_scaling

    def decide(states, gpus, window_s, start=None) -> EkyaDecision:
        true = {(st.name, c.name): c for st in states for c in st.configs}
        d = thief.decide([replace(st, configs=tuple(estimate[c] for c in st.configs)) for st in states],
                         gpus, window_s, start)
        return replace(d, streams=tuple(
            replace(sd, retrain_s=true[sd.stream, sd.config].gpu_seconds / sd.retrain_gpus ** alpha)
            if sd.config is not None and (sd.stream, sd.config) in true else sd for sd in d.streams))

    return EkyaPolicy(name, decide, thief.reinvoke)


def with_estimation_error(scenario: EkyaScenario, sigma: float, rng: np.random.Generator) -> EkyaPolicy:
    """The thief seeing every config's accuracy plus N(0, sigma), clipped to [0, 1] (Fig. 2.11b)."""
    estimate = {c: replace(c, accuracy=float(np.clip(c.accuracy + rng.normal(0.0, sigma), 0.0, 1.0)))
                for s in scenario.streams for w in s.windows for c in w.configs}
    return told_thief(scenario, estimate, f"thief_error_{sigma:g}")


def with_cost_error(scenario: EkyaScenario, sigma: float, rng: np.random.Generator) -> EkyaPolicy:
    """The thief seeing every config's GPU-seconds times 1 + N(0, sigma), at least 5% of the truth."""
    estimate = {c: replace(c, gpu_seconds=c.gpu_seconds * max(0.05, 1.0 + rng.normal(0.0, sigma)))
                for s in scenario.streams for w in s.windows for c in w.configs}
    return told_thief(scenario, estimate, f"thief_cost_error_{sigma:g}")


def with_profiling_cost(scenario: EkyaScenario, cost_factor: float) -> EkyaScenario:
    """Every config of a stream's window also pays ``cost_factor`` x the GPU-seconds of all its configs."""
    def window(w: WindowSpec) -> WindowSpec:
        overhead = cost_factor * sum(c.gpu_seconds for c in w.configs)
        return replace(w, configs=tuple(replace(c, gpu_seconds=c.gpu_seconds + overhead) for c in w.configs))

    streams = tuple(ScenarioStream(s.name, s.inference, tuple(window(w) for w in s.windows)) for s in scenario.streams)
    return replace(scenario, streams=streams)


def with_annotation_delay(policy: EkyaPolicy, window_s: float, delay_s: float) -> EkyaPolicy:
    """``policy`` deciding over the window minus the labels' remaining delay; retraining deploys after it."""
    def decide(states, gpus, remaining_s, start=None) -> EkyaDecision:
        wait = max(0.0, delay_s - (window_s - remaining_s))  # labels still to come at this decision
        d = policy.decide(states, gpus, max(remaining_s - wait, 1e-6), start)
        if wait <= 0:
            return d
        return replace(d, streams=tuple(replace(sd, retrain_s=sd.retrain_s + wait) if sd.config is not None else sd
                                        for sd in d.streams))

    return EkyaPolicy(f"{policy.name}_delay_{delay_s:g}", decide, policy.reinvoke)


def cloud_retraining(scenario: EkyaScenario, uplink_mbps: float, downlink_mbps: float) -> EkyaPolicy:
    """Edge GPUs serve inference only; stream k's best config arrives from the cloud after the transfers."""
    serve = make_policy("noretrain", scenario)
    n = len(scenario.streams)
    arrival = [n * UPLOAD_MB / uplink_mbps + (k + 1) * MODEL_MB / downlink_mbps for k in range(n)]

    def decide(states, gpus, window_s, start=None) -> EkyaDecision:
        d = serve.decide(states, gpus, window_s, start)
        best = {st.name: max(st.configs, key=lambda c: c.accuracy).name for st in states if st.configs}
        return replace(d, streams=tuple(replace(sd, config=best[sd.stream], retrain_gpus=0.0, retrain_s=arrival[k])
                                        if sd.stream in best else sd for k, sd in enumerate(d.streams)))

    return EkyaPolicy(f"cloud_{uplink_mbps:g}_{downlink_mbps:g}", decide, reinvoke=False)


def best_uniform(scenario: EkyaScenario, wrap: Callable[[EkyaPolicy], EkyaPolicy] = lambda p: p) -> float:
    """Highest mean accuracy of the uniform baselines, each wrapped by ``wrap``."""
    return max(run_policy(scenario, wrap(make_policy(p, scenario))) for p in UNIFORM)


def estimation_error(scenario: EkyaScenario, trials: int, seed: int) -> dict[str, float]:
    """Thief accuracy (mean over noise draws) at each profiler error, and the best uniform's."""
    out = {"robust_error_best_uniform_accuracy": best_uniform(scenario)}
    for sigma in ERRORS:
        draws = [run_policy(scenario, with_estimation_error(scenario, sigma, np.random.default_rng([seed, t])))
                 for t in range(trials if sigma > 0 else 1)]
        out[f"robust_error_{round(sigma * 100)}pct_thief_accuracy"] = float(np.mean(draws))
        out[f"robust_error_{round(sigma * 100)}pct_worst_draw_accuracy"] = float(np.min(draws))
    base = out["robust_error_0pct_thief_accuracy"]
    out["robust_error_max_drop"] = base - min(out[f"robust_error_{round(s * 100)}pct_thief_accuracy"] for s in ERRORS)
    return out


def cost_error(scenario: EkyaScenario, trials: int, seed: int) -> dict[str, float]:
    """Thief accuracy (mean over noise draws) at each relative error of the profiled GPU-seconds."""
    return {f"robust_cost_error_{round(sigma * 100)}pct_thief_accuracy": float(np.mean(
        [run_policy(scenario, with_cost_error(scenario, sigma, np.random.default_rng([seed, 1000 + t])))
         for t in range(trials)])) for sigma in COST_ERRORS}


def profiling_cost(scenario: EkyaScenario) -> dict[str, float]:
    """Thief accuracy when it pays micro-profiling vs exhaustive (100x) profiling, and the best uniform's."""
    out = {"robust_profiling_best_uniform_accuracy": best_uniform(scenario)}
    for name, factor in COST_FACTORS.items():
        paid = with_profiling_cost(scenario, factor)
        out[f"robust_profiling_{name}_thief_accuracy"] = run_policy(paid, make_policy("thief", paid))
    return out


def annotation_delay(scenario: EkyaScenario) -> dict[str, float]:
    """Thief and best-uniform accuracy when labels arrive ``delay_s`` into each window."""
    out = {}
    for d in DELAYS_S:
        wrap = (lambda p, d=d: with_annotation_delay(p, scenario.window_s, d))
        out[f"robust_delay_{d:g}s_thief_accuracy"] = run_policy(scenario, wrap(make_policy("thief", scenario)))
        out[f"robust_delay_{d:g}s_best_uniform_accuracy"] = best_uniform(scenario, wrap)
    out["robust_noretrain_accuracy"] = run_policy(scenario, make_policy("noretrain", scenario))
    return out


def cloud(windows: int, seed: int) -> dict[str, float]:
    """Table 2.3: cloud retraining over each link vs the thief at the edge, 400 s windows."""
    scenario = generate(STREAMS, GPUS, windows=windows, window_s=CLOUD_WINDOW_S, seed=seed)
    out = {f"cloud_{link}_accuracy": run_policy(scenario, cloud_retraining(scenario, up, down))
           for link, (up, down) in LINKS_MBPS.items()}
    out["cloud_edge_thief_accuracy"] = run_policy(scenario, make_policy("thief", scenario))
    return out


def evaluate(windows: int, trials: int, seed: int) -> dict[str, float]:
    """Every robustness figure on seeded 8-stream, 4-GPU workloads."""
    scenario = generate(STREAMS, GPUS, windows=windows, seed=seed)
    return {**estimation_error(scenario, trials, seed), **cost_error(scenario, trials, seed),
            **profiling_cost(scenario), **annotation_delay(scenario), **cloud(windows, seed)}


SYNTHETIC = "synthetic streams (gpu.sim.ekya.workloads), not the paper's videos"


def rows(out: dict[str, float]) -> list[Row]:
    """The printed comparison, each row judged against the paper's claim it quotes."""
    base = out["robust_error_0pct_thief_accuracy"]
    r = []
    for s in ERRORS:
        pct = round(s * 100)
        acc = out[f"robust_error_{pct}pct_thief_accuracy"]
        r.append(Row(f"2.11b profiler error {pct}%: thief (drop)", f"{acc:.1%} ({acc - base:+.1%})",
                     "max drop 3% up to 20% error", base - acc <= 0.03,
                     "" if base - acc <= 0.03 else SYNTHETIC))
    r.append(Row("2.4 profiled cost error 10/20/50%: thief",
                 " / ".join(f"{out[f'robust_cost_error_{round(s * 100)}pct_thief_accuracy']:.1%}" for s in COST_ERRORS)))
    r.append(Row("2.11b ... best uniform (ignores profiles)", f"{out['robust_error_best_uniform_accuracy']:.1%}"))
    micro, exhaustive = out["robust_profiling_micro_thief_accuracy"], out["robust_profiling_exhaustive_thief_accuracy"]
    r.append(Row("2.4 profiling: micro (1x) / exhaustive (100x) thief", f"{micro:.1%} / {exhaustive:.1%}",
                 "micro 100x cheaper, 5.8% error: micro >= exhaustive - 5.8 pts", micro >= exhaustive - 0.058,
                 "" if micro >= exhaustive - 0.058 else SYNTHETIC))
    r.append(Row("2.4 ... best uniform (no profiling)", f"{out['robust_profiling_best_uniform_accuracy']:.1%}"))
    for d in DELAYS_S:
        r.append(Row(f"2.4 annotation delay {d:g} s of 200 s: thief / best uniform",
                     f"{out[f'robust_delay_{d:g}s_thief_accuracy']:.1%} / "
                     f"{out[f'robust_delay_{d:g}s_best_uniform_accuracy']:.1%}"))
    r.append(Row("2.4 ... no retraining", f"{out['robust_noretrain_accuracy']:.1%}"))
    edge = out["cloud_edge_thief_accuracy"]
    paper = {"cellular": "68.5% (below Ekya's 77.8%)", "satellite": "69.2% (below Ekya's 77.8%)",
             "cellular_2x": "71.2% (below Ekya's 77.8%)"}
    for link in LINKS_MBPS:
        acc = out[f"cloud_{link}_accuracy"]
        r.append(Row(f"T2.3 cloud retraining over {link}", f"{acc:.1%}", paper[link], acc < edge,
                     "" if acc < edge else SYNTHETIC))
    clouds = max(out[f"cloud_{link}_accuracy"] for link in LINKS_MBPS)
    r.append(Row("T2.3 Ekya (thief at the edge)", f"{edge:.1%}", "77.8%, above every cloud link", edge > clouds,
                 "" if edge > clouds else SYNTHETIC))
    return r


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__, "2 windows, 3 noise draws (about 15 s)").parse_args(argv)
    t0 = time.perf_counter()
    out = evaluate(2 if args.quick else 5, 3 if args.quick else 10, args.seed)
    print_beside_paper(rows(out))
    return finish(args, out, t0)


if __name__ == "__main__":
    sys.exit(main())
