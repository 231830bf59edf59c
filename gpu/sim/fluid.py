"""``gpuflows simulate fluid SCENARIO``: one tuning job under FIFO, StaticFluid and Static+DynamicFluid.

Scenario format: ``docs/fluid.md``. Policies (thesis §3.6.1 baselines):

* ``fifo`` — one trial per GPU, FIFO queue; asynchronous algorithms launch a trial per idle GPU;
* ``static_fluid`` — Algorithm 3.1 only;
* ``fluid`` — Algorithms 3.1 + 3.2 (FLUID as evaluated).

``c`` comes from ``fluid.c``, else from a measured ``workload.packing_curve`` (Eq. 3.1 fit), else from
``workload.alpha`` (model ``O^p``); ``d`` from ``fluid.d``, else ``max_parallelism(beta, gpus)``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import choose, load_scenario, positive, require
from gpu.schedulers.fluid import FluidParams, Trial, fit_packing_curve, lower_bound, max_parallelism, packing_limit
from gpu.schedulers.fluid_baselines import FifoExecutor
from gpu.schedulers.fluid_executor import FluidExecutor
from gpu.sim.fluid_engine import RunResult, simulate
from gpu.sim.fluid_workload import Workload
from gpu.tuning import ALGORITHMS, FixedTrials, TuningAlgorithm, parse_space

POLICIES = ("fifo", "static_fluid", "fluid")


def build_executor(policy: str, gpus: int, params: FluidParams, concurrency: int | None = None):
    """The executor behind a policy name."""
    choose(policy, "policy", list(POLICIES))
    if policy == "fifo":
        return FifoExecutor(list(range(gpus)))
    return FluidExecutor(list(range(gpus)), params, dynamic=policy == "fluid", concurrency=concurrency)


def _algorithm_factory(data: Mapping[str, Any], seed: int) -> tuple[Callable[[], TuningAlgorithm], dict | None]:
    """A fresh algorithm per policy (same seed, so every policy tunes the same configs)."""
    if "trials" in data:
        rows = data["trials"]
        if not isinstance(rows, list) or not rows:
            raise ConfigError("trials", rows, "must be a non-empty list of {id, budget}")
        trials = [(str(require(r, "id", "trials.")), positive(require(r, "budget", "trials."), f"trials.{r['id']}.budget"),
                   dict(r.get("config", {}))) for r in rows]
        return (lambda: FixedTrials(trials)), None
    algo = dict(require(data, "algorithm"))
    cls = choose(algo.pop("name", None), "algorithm.name", ALGORITHMS)
    space = parse_space(require(algo, "space", "algorithm."), "algorithm.space")
    algo.pop("space")
    allowed = set(inspect.signature(cls.__init__).parameters) - {"self", "space", "seed"}
    for key in algo:
        if key not in allowed:
            raise ConfigError(f"algorithm.{key}", algo[key], f"unknown for {cls.name}; use {sorted(allowed)}")
    return (lambda: cls(space, seed=seed, **algo)), space


def _params(data: Mapping[str, Any], gpus: int) -> tuple[FluidParams, Workload, dict[str, Any], int | None]:
    fl = dict(data.get("fluid", {}))
    wl = dict(data.get("workload", {}))
    info: dict[str, Any] = {}
    o_th = float(fl.get("o_th", 0.05))
    if "packing_curve" in wl:
        if "alpha" in wl:
            raise ConfigError("workload.alpha", wl["alpha"], "give alpha or packing_curve, not both")
        curve = wl.pop("packing_curve")
        fit = fit_packing_curve(require(curve, "ps", "workload.packing_curve."),
                                require(curve, "throughputs", "workload.packing_curve."), o_th)
        wl["alpha"] = fit.alpha
        info.update(fitted_alpha=fit.alpha, fitted_c=fit.c)
        c_default = fit.c
    else:
        c_default = packing_limit(float(wl.get("alpha", 1.0)), o_th)
    known = {"iter_time_s", "runtime_cv", "alpha", "beta", "tau"}
    for key in wl:
        if key not in known:
            raise ConfigError(f"workload.{key}", wl[key], f"unknown; use {sorted(known | {'packing_curve'})}")
    beta = float(wl.get("beta", 1.0))
    d = fl.get("d", max_parallelism(beta, gpus) if beta >= 1 else 1)
    params = FluidParams(c=fl.get("c", c_default), d=d, epsilon=fl.get("epsilon", 0.0))
    info.update(c=params.c, d=params.d, epsilon=params.epsilon)
    return params, wl, info, fl.get("concurrency")


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """Simulate the scenario's tuning job under each policy (None = all) and compare makespans."""
    data = load_scenario(scenario_path)
    gpus = int(positive(require(data, "gpus"), "gpus"))
    seed = int(data.get("seed", 0))
    chosen = list(policies or data.get("policies") or POLICIES)
    for p in chosen:
        choose(p, "policy", list(POLICIES))
    params, wl, info, concurrency = _params(data, gpus)
    make_algorithm, space = _algorithm_factory(data, seed)
    workload = Workload(space=space, seed=seed, **wl)
    results = {p: simulate(p, make_algorithm(), build_executor(p, gpus, params, concurrency), workload, gpus,
                           params.epsilon) for p in chosen}
    return report(str(data.get("name", scenario_path)), results, info, gpus, make_algorithm, workload)


def report(name: str, results: dict[str, RunResult], info: dict[str, Any], gpus: int,
           make_algorithm: Callable[[], TuningAlgorithm], workload: Workload) -> SimulationReport:
    """Table per policy plus the flat summary (``fluid_makespan_s``, ``speedup_vs_fifo`` ...)."""
    fifo = results.get("fifo")
    table = [{"policy": r.policy, "makespan_s": r.makespan_s,
              "speedup_vs_fifo": fifo.makespan_s / r.makespan_s if fifo else float("nan"),
              "utilisation": r.utilisation, "efficiency": r.efficiency, "trials": r.trials, "groups": r.groups,
              "resizes": r.resizes, "best_loss": r.best_loss} for r in results.values()]
    summary: dict[str, float] = {f"{p}_makespan_s": r.makespan_s for p, r in results.items()}
    summary.update({f"{p}_utilisation": r.utilisation for p, r in results.items()})
    if fifo:
        for p, r in results.items():
            if p != "fifo":
                summary["speedup_vs_fifo" if p == "fluid" else f"{p}_speedup_vs_fifo"] = fifo.makespan_s / r.makespan_s
    algorithm = make_algorithm()
    if isinstance(algorithm, FixedTrials):  # one TrialGroup: the thesis's OPT lower bound applies
        group = algorithm.suggest(gpus)
        trials = [workload.profile(t) for t in group.trials]
        summary["lower_bound_s"] = lower_bound(trials, gpus, int(info["d"]))
    summary.update({k: float(v) for k, v in info.items()})
    return SimulationReport("fluid", table, summary, {"parameters": [{"name": k, "value": v} for k, v in info.items()]})


__all__ = ["POLICIES", "build_executor", "run", "report", "Trial"]
