"""``gpuflows simulate fluid SCENARIO``: one tuning job under FIFO, StaticFluid and Static+DynamicFluid.

Scenario format: ``docs/fluid.md``. Policies (thesis §3.6.1 baselines):

* ``fifo`` — one trial per GPU, FIFO queue; asynchronous algorithms launch a trial per idle GPU;
* ``static_fluid`` — Algorithm 3.1 only;
* ``fluid`` — Algorithms 3.1 + 3.2 (FLUID as evaluated).

``c`` comes from ``fluid.c``, else from a measured ``workload.packing_curve`` (Eq. 3.1 fit), else from
``workload.alpha`` (model ``O^p``); ``d`` from ``fluid.d``, else ``max_parallelism(beta, gpus)``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import (MAX_COUNT, MAX_GPUS, MAX_RATE, MAX_SECONDS, MAX_SEED, choose, integer, known_fields, label,
                          load_scenario, mapping, policy_names, positive, require)
from gpu.schedulers.fluid.algorithms import (MAX_PACKED, FluidParams, PackingCurve, Trial, fit_packing_curve,
                                             lower_bound, max_parallelism, packing_limit)
from gpu.schedulers.fluid.policies import POLICIES, build_executor
from gpu.sim.fluid.engine import RunResult, simulate
from gpu.sim.fluid.workload import Workload
from gpu.schedulers.fluid.tuning import ALGORITHMS, FixedTrials, TuningAlgorithm, parse_space

SCENARIO_KEYS = ("name", "gpus", "seed", "policies", "fluid", "workload", "trials", "algorithm")
FLUID_KEYS = ("c", "d", "epsilon", "o_th", "concurrency")
WORKLOAD_KEYS = ("iter_time_s", "runtime_cv", "alpha", "beta", "tau", "packing_curve")




def _trials(rows: Any) -> list[tuple[str, float, dict[str, Any]]]:
    """The explicit one-group job: ``[{id, budget, config?}]`` with unique ids."""
    if not isinstance(rows, list) or not rows:
        raise ConfigError("trials", rows, "must be a non-empty list of {id, budget}")
    trials, seen = [], set()
    for i, row in enumerate(rows):
        where = f"trials[{i}]"
        row = mapping(row, where, optional=False)
        known_fields(row, ("id", "budget", "config"), f"{where}.")
        tid = require(row, "id", f"{where}.")
        if isinstance(tid, bool) or not isinstance(tid, (str, int)) or str(tid) in seen or not str(tid):
            raise ConfigError(f"{where}.id", tid, "must be a unique, non-empty name")
        seen.add(str(tid))
        trials.append((str(tid), positive(require(row, "budget", f"{where}."), f"{where}.budget", upper=MAX_COUNT),
                       mapping(row.get("config"), f"{where}.config")))
    return trials


def _algorithm_factory(data: Mapping[str, Any], seed: int) -> tuple[Callable[[], TuningAlgorithm], dict | None]:
    """A fresh algorithm per policy (same seed, so every policy tunes the same configs)."""
    if "trials" in data:
        if "algorithm" in data:
            raise ConfigError("algorithm", data["algorithm"], "give trials or algorithm, not both")
        trials = _trials(data["trials"])
        return (lambda: FixedTrials(trials)), None
    algo = mapping(require(data, "algorithm"), "algorithm", optional=False)
    cls = choose(algo.pop("name", None), "algorithm.name", ALGORITHMS)
    space = parse_space(require(algo, "space", "algorithm."), "algorithm.space")
    algo.pop("space")
    allowed = set(inspect.signature(cls.__init__).parameters) - {"self", "space", "seed"}
    for key in algo:
        if key not in allowed:
            raise ConfigError(f"algorithm.{key}", algo[key], f"unknown for {cls.name}; use {sorted(allowed)}")
    return (lambda: cls(space, seed=seed, **algo)), space


def _packing_curve(raw: Any, o_th: float) -> PackingCurve:
    """Fit ``workload.packing_curve``: levels are distinct whole numbers including 1, one throughput each."""
    where = "workload.packing_curve"
    curve = mapping(raw, where, optional=False)
    known_fields(curve, ("ps", "throughputs"), f"{where}.")
    ps, xs = require(curve, "ps", f"{where}."), require(curve, "throughputs", f"{where}.")
    for name, values in (("ps", ps), ("throughputs", xs)):
        if not isinstance(values, list) or len(values) < 2:
            raise ConfigError(f"{where}.{name}", values, "must be a list of at least 2 numbers")
    levels = [integer(p, f"{where}.ps[{i}]", minimum=1, maximum=MAX_PACKED) for i, p in enumerate(ps)]
    if len(set(levels)) != len(levels) or 1 not in levels:
        raise ConfigError(f"{where}.ps", ps, "packing levels must be distinct and include 1")
    rates = [positive(x, f"{where}.throughputs[{i}]", upper=MAX_RATE) for i, x in enumerate(xs)]
    if len(rates) != len(levels):
        raise ConfigError(f"{where}.throughputs", xs, f"need one throughput per packing level ({len(levels)})")
    return fit_packing_curve(levels, rates, o_th)


def _params(data: Mapping[str, Any], gpus: int, seed: int) -> tuple[FluidParams, Workload, dict[str, Any], int | None]:
    """FLUID's knobs and the synthetic workload, every field checked under its dotted name."""
    fl = mapping(data.get("fluid"), "fluid")
    known_fields(fl, FLUID_KEYS, "fluid.")
    wl = mapping(data.get("workload"), "workload")
    known_fields(wl, WORKLOAD_KEYS, "workload.")
    info: dict[str, Any] = {}
    o_th = positive(fl.get("o_th", 0.05), "fluid.o_th", allow_zero=True)
    if o_th >= 1:
        raise ConfigError("fluid.o_th", o_th, "threshold must be in [0, 1)")
    fit = None
    if "packing_curve" in wl:
        if "alpha" in wl:
            raise ConfigError("workload.alpha", wl["alpha"], "give alpha or packing_curve, not both")
        fit = _packing_curve(wl.pop("packing_curve"), o_th)
        wl["alpha"] = fit.alpha
        info.update(fitted_alpha=fit.alpha, fitted_c=fit.c)
    workload = Workload(seed=seed, **wl)
    if "c" in fl:
        c = integer(fl["c"], "fluid.c", minimum=1, maximum=MAX_PACKED)
    else:
        c = fit.c if fit else packing_limit(workload.alpha, o_th)
    d = integer(fl["d"], "fluid.d", minimum=1, maximum=MAX_GPUS) if "d" in fl else max_parallelism(workload.beta, gpus)
    epsilon = positive(fl.get("epsilon", 0.0), "fluid.epsilon", allow_zero=True, upper=MAX_SECONDS)
    concurrency = fl.get("concurrency")
    if concurrency is not None:
        concurrency = integer(concurrency, "fluid.concurrency", minimum=1, maximum=MAX_COUNT)
    params = FluidParams(c=c, d=d, epsilon=epsilon)
    info.update(c=params.c, d=params.d, epsilon=params.epsilon)
    return params, workload, info, concurrency


def _policies(data: Mapping[str, Any], policies: list[str] | None) -> list[str]:
    """The CLI's policies, else the scenario's ``policies`` list (a list of names, not one string), else all."""
    chosen = policy_names(data, policies, list(POLICIES))
    for p in chosen:
        choose(p, "policy", list(POLICIES))
    return chosen


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """Simulate the scenario's tuning job under each policy (None = all) and compare makespans."""
    data = load_scenario(scenario_path)
    known_fields(data, SCENARIO_KEYS, "")
    gpus = integer(require(data, "gpus"), "gpus", minimum=1)
    if gpus > MAX_GPUS:
        raise ConfigError("gpus", gpus, f"at most {MAX_GPUS:,} GPUs")
    seed = integer(data.get("seed", 0), "seed", minimum=0, maximum=MAX_SEED)
    name = label(data.get("name", scenario_path), "name")
    chosen = _policies(data, policies)
    params, workload, info, concurrency = _params(data, gpus, seed)
    make_algorithm, space = _algorithm_factory(data, seed)
    workload = dataclasses.replace(workload, space=space)
    results = {p: simulate(p, make_algorithm(), build_executor(p, gpus, params, concurrency), workload, gpus,
                           params.epsilon) for p in chosen}
    return report(name, results, info, gpus, make_algorithm, workload)


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


__all__ = ["run", "report", "Trial"]
