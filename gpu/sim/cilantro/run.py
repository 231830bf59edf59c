"""Simulator of Cilantro's multi-tenant experiment (thesis ch. 3, §3.7, Table 3.2, Figs. 3.8–3.9).

Jobs report every ``report_s`` (10 s) with noise; every ``round_s`` (120 s) the round controller
:class:`~gpu.schedulers.cilantro.controller.CilantroRound` — the one the Prefect flow drives — folds the
reports into the learners and decides the next round. Metrics (eqs. 3.1–3.3, 3.8) are computed per
report from the *true* performance at the actual loads and time-averaged. Ground truth and loads follow
the authors' code (docs/cilantro.md); latency jobs observe ``Binomial(N, p)/N`` with ``N = ℓ·10 s`` and report ``σ = 0.5/√N`` (the
largest binomial standard error; the code's ``10/√(2N)`` is looser still), ML jobs observe
``p·(1 + 0.05 ε)``. Load forecasts depend only on the trace, so they are computed once and shared
by every policy (the flow gives each job its own forecaster).

Scenario kinds: ``multitenant`` (default), ``static`` (Fig. 3.4's three linear jobs on exact
curves) and ``microservices`` (see :mod:`gpu.sim.cilantro.microservices`); formats in docs/cilantro.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import load_scenario, policy_names
from gpu.schedulers.cilantro.policies import POLICIES, make_policy
from gpu.schedulers.cilantro.forecasters import ArimaForecaster, EwmaForecaster
from gpu.schedulers.cilantro.learners import IntervalBinaryTree, SaturatingLearner
from gpu.schedulers.cilantro.metrics import njc_fairness, njc_fairness_resource, useful_usage
from gpu.schedulers.cilantro.controller import CilantroRound, JobReport, LoadForecasts, RoundJob
from gpu.schedulers.cilantro.types import AllocationPolicy
from gpu.sim.cilantro.scenario import MultiTenantConfig, SimJob, parse_multitenant, run_static

METRICS = ("social_welfare", "egalitarian_welfare", "njc_fairness", "njc_fairness_resource", "useful_usage")


@dataclass
class PolicyRun:
    """Per-round metric traces of one policy on one seed (rounds × metric), plus timings."""

    policy: str
    rounds: dict[str, np.ndarray]
    job_utility: np.ndarray
    decision_s: np.ndarray
    allocations: list[dict[str, float]] = field(default_factory=list)

    def mean(self, metric: str) -> float:
        return float(self.rounds[metric].mean())


def make_forecaster(cfg: MultiTenantConfig) -> ArimaForecaster | EwmaForecaster:
    """The scenario's load forecaster (``forecaster`` field)."""
    if cfg.forecaster == "arima":
        return ArimaForecaster(d=cfg.arima_d, confidence=cfg.forecast_confidence, window=cfg.forecast_window)
    return EwmaForecaster(confidence=cfg.forecast_confidence)


def load_ucbs(cfg: MultiTenantConfig, loads: np.ndarray) -> np.ndarray:
    """Load UCB per (round, job) for rounds ``0 … rounds`` (the last one follows the final round), from the
    round's own forecasts (:class:`~gpu.schedulers.cilantro.controller.LoadForecasts`) fed with past reports."""
    k = cfg.reports_per_round
    names = [job.spec.name for job in cfg.jobs]
    forecasts = LoadForecasts({job.spec.name: make_forecaster(cfg) for job in cfg.jobs if not job.profile.throughput},
                              {job.spec.name: job.profile.p50_load for job in cfg.jobs}, k)
    out = np.ones((cfg.rounds + 1, len(cfg.jobs)))
    for r in range(cfg.rounds + 1):
        for j, name in enumerate(names):
            if r > 0:
                forecasts.observe(name, tuple(loads[j, (r - 1) * k: r * k]))
            out[r, j] = forecasts.ucb(name, r)
    return out


@dataclass
class SharedLoads:
    """Load UCBs computed once per seed (:func:`load_ucbs`) and read by every policy's round: the forecasts
    depend only on the trace, so the policies share them."""

    names: list[str]
    table: np.ndarray

    def observe(self, job: str, loads: tuple[float, ...]) -> None:
        return None

    def ucb(self, job: str, round_index: int) -> float:
        return float(self.table[round_index, self.names.index(job)])

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        return None


def make_learner(cfg: MultiTenantConfig, job: SimJob) -> IntervalBinaryTree | SaturatingLearner:
    """The job's learner; ``learner.beta`` unset keeps the learner's default (the tree: the authors' β_t)."""
    p = job.profile
    beta = {} if cfg.learner_beta is None else {"beta": cfg.learner_beta}
    if cfg.learner == "saturating":
        return SaturatingLearner(p.int_ub / 4, bounds=p.perf_bounds, **beta)
    lip = p.lip_const if cfg.lipschitz is None else cfg.lipschitz
    return IntervalBinaryTree(p.int_ub, lip, bounds=p.perf_bounds, **beta)


def round_jobs(cfg: MultiTenantConfig) -> tuple[RoundJob, ...]:
    """The scenario's jobs as the round controller knows them: learner, interval end, true curve."""
    return tuple(RoundJob(job.spec, job.profile.int_ub, job.profile.perf_bounds, partial(make_learner, cfg, job),
                          truth=job.profile.perf) for job in cfg.jobs)


def simulate_policy(cfg: MultiTenantConfig, policy: AllocationPolicy, seed: int, loads: np.ndarray, ucbs: np.ndarray,
                    *, start_round: int = 0, stop_round: int | None = None, state: dict | None = None,
                    keep_allocations: bool = False) -> tuple[PolicyRun, dict]:
    """Run ``policy`` for rounds ``[start_round, stop_round)``; returns its traces and a resumable state.

    The world of :class:`~gpu.schedulers.cilantro.controller.CilantroRound`: outcomes come from the profiled true
    curves with report noise (:func:`_observe`). ``state`` (from a previous call's return) restores the
    round (learners, policy, RNG, planned decision) and the noise RNG, so a run split in two equals one
    uninterrupted run.
    """
    n, k, stop = len(cfg.jobs), cfg.reports_per_round, cfg.rounds if stop_round is None else stop_round
    names = [job.spec.name for job in cfg.jobs]
    ctl = CilantroRound(round_jobs(cfg), policy, capacity=cfg.capacity, unit=cfg.unit, max_change=cfg.max_change,
                        loads=SharedLoads(names, ucbs), seed=seed, warmup_reports=cfg.warmup_reports)
    noise = np.random.default_rng([seed, 11])
    if state is not None:
        ctl.restore(state["round"])
        noise.bit_generator.state = state["noise"]
    fair_alloc = cfg.capacity / n
    unit_demand = np.array([job.profile.unit_demand(job.spec.slo) for job in cfg.jobs])
    traces = {m: [] for m in METRICS}
    job_util, times, allocs = np.zeros(n), [], []
    t0 = time.perf_counter()
    decision = ctl.planned or ctl.on_round(start_round * cfg.round_s, {})
    decide_s = time.perf_counter() - t0
    for r in range(start_round, stop):
        alloc = decision.allocation
        a = np.array([alloc[name] for name in names])
        ld = loads[:, r * k:(r + 1) * k]
        perf = np.vstack([job.profile.perf(a[j], ld[j]) for j, job in enumerate(cfg.jobs)])
        util = np.vstack([job.spec.utility_of(perf[j]) for j, job in enumerate(cfg.jobs)])
        fair_u = np.vstack([job.spec.utility_of(job.profile.perf(fair_alloc, ld[j])) for j, job in enumerate(cfg.jobs)])
        demands = unit_demand[:, None] * ld
        traces["social_welfare"].append(util.mean(axis=0).mean())
        traces["egalitarian_welfare"].append(util.min(axis=0).mean())
        traces["njc_fairness"].append(np.mean([njc_fairness(util[:, s], fair_u[:, s]) for s in range(k)]))
        traces["njc_fairness_resource"].append(np.mean([njc_fairness_resource(a, demands[:, s], cfg.capacity) for s in range(k)]))
        traces["useful_usage"].append(np.mean([useful_usage(a, demands[:, s], cfg.capacity) for s in range(k)]))
        job_util += util.mean(axis=1)
        reward, sigma = _observe(cfg, perf, ld, noise)
        if keep_allocations:
            allocs.append(dict(alloc))
        t0 = time.perf_counter()
        decision = ctl.on_round((r + 1) * cfg.round_s, {
            name: JobReport(float(a[j]), tuple(ld[j].tolist()), tuple(reward[j].tolist()), tuple(sigma[j].tolist()))
            for j, name in enumerate(names)})
        times.append(decide_s)
        decide_s = time.perf_counter() - t0
    run = PolicyRun(policy.name, {m: np.array(v) for m, v in traces.items()}, job_util / max(1, stop - start_round),
                    np.array(times), allocs)
    return run, {"round": ctl.save(), "noise": noise.bit_generator.state}


def _observe(cfg: MultiTenantConfig, perf: np.ndarray, loads: np.ndarray, noise: np.random.Generator):
    """Noisy rewards and the σ each client reports (module docstring)."""
    reward, sigma = np.empty_like(perf), np.empty_like(perf)
    for j, job in enumerate(cfg.jobs):
        if job.profile.throughput:
            reward[j] = perf[j] * (1 + cfg.ml_noise * noise.standard_normal(perf.shape[1]))
            sigma[j] = np.maximum(cfg.ml_noise * perf[j], 1e-3)
        else:
            count = np.maximum(1, np.round(loads[j] * cfg.report_s)).astype(int)
            reward[j] = noise.binomial(count, np.clip(perf[j], 0, 1)) / count
            sigma[j] = 0.5 / np.sqrt(count)
    return reward, sigma


def simulate_all(cfg: MultiTenantConfig, policies: list[str], keep_allocations: bool = False) -> dict[str, list[PolicyRun]]:
    """Every policy on every seed, sharing loads and load forecasts per seed."""
    out: dict[str, list[PolicyRun]] = {p: [] for p in policies}
    for seed in cfg.seeds:
        loads = cfg.loads(seed)
        ucbs = load_ucbs(cfg, loads)
        for name in policies:
            out[name].append(simulate_policy(cfg, make_policy(name), seed, loads, ucbs, keep_allocations=keep_allocations)[0])
    return out


def summarize(runs: dict[str, list[PolicyRun]], round_s: float) -> SimulationReport:
    """Table 3.2-style rows (mean over seeds) and flat ``<policy>_<metric>`` summary keys."""
    table, summary = [], {}
    for name, seeds in runs.items():
        row = {"policy": name}
        for m in METRICS:
            row[m] = float(np.mean([r.mean(m) for r in seeds]))
            summary[f"{name.replace('-', '_')}_{m}"] = row[m]
        row["decision_ms"] = float(np.mean([r.decision_s.mean() for r in seeds]) * 1e3)
        summary[f"{name.replace('-', '_')}_decision_to_round_ratio"] = row["decision_ms"] / 1e3 / round_s
        table.append(row)
    return SimulationReport("cilantro", table, summary)


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """``gpuflows simulate cilantro SCENARIO``: run the scenario's policies (all by default)."""
    raw = load_scenario(scenario_path)
    kind = raw.get("kind", "multitenant")
    if kind == "static":
        return run_static(raw, policies)
    if kind == "microservices":
        from gpu.sim.cilantro.microservices import run_microservices

        return run_microservices(raw, policies)
    if kind != "multitenant":
        raise ConfigError("kind", kind, "unknown; choose one of ['microservices', 'multitenant', 'static']")
    cfg = parse_multitenant(raw)
    names = policy_names(raw, policies, list(POLICIES))
    for name in names:
        make_policy(name)
    return summarize(simulate_all(cfg, names), cfg.round_s)
