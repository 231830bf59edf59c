"""Simulator of Cilantro's microservices experiment (thesis ch. 3, §3.7, Fig. 3.12).

One application (Hotel Reservation, 19 services) on ``capacity`` CPUs; every round the policy
picks an allocation, the app serves the round's load (Twitter trace, scaled to ``mean_load``
requests/s) and reports its P99 (true P99 × lognormal noise). Cilantro's GP learns
``−log P99`` from ``[ℓ/ℓ_ref, a/(R/n)]``. The metric is the time-averaged true P99 (ms).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import MAX_RATE, integer, known_fields, policy_names, positive
from gpu.schedulers.cilantro.microservices import (HOTEL_SERVICES, MaternGP, MicroservicePolicy, MicroserviceSnapshot,
                                                   hotel_reservation)
from gpu.sim.cilantro.scenario import MAX_UNITS, seed_list
from gpu.sim.cilantro.workloads import TRACE_MEDIAN, load_series, load_profile

MIN_CPUS_PER_SERVICE = 4  # the policies' random splits give each service 4 CPUs first; fewer would go negative
MAX_ROUNDS = 2_000  # the GP refits on every past round, so time and memory grow with rounds squared


def simulate_microservices(capacity: int, rounds: int, mean_load: float, policy: MicroservicePolicy, seed: int,
                           noise: float = 0.05) -> dict[str, Any]:
    graph = hotel_reservation(np.random.default_rng([seed, 5]))
    n = len(graph.services)
    rng = np.random.default_rng([seed, 9])
    prof = load_profile("craydb0")
    loads = load_series(prof, rounds, int(rng.integers(0, 2952))) * mean_load * TRACE_MEDIAN / prof.p50_load / 2457.6
    gp, history, p99s, times = MaternGP(), [], [], []
    fair = capacity / n

    def features(a: np.ndarray, load: float) -> np.ndarray:
        a = np.atleast_2d(a)
        return np.column_stack([np.full(len(a), load / mean_load), a / fair])

    for r in range(rounds):
        t0 = time.perf_counter()
        load_ucb = float(loads[max(0, r - 1)])  # last round's load stands in for a forecast here
        obj = (lambda a, lu=load_ucb: gp.ucb(features(a, lu))) if policy.learner == "online" else None
        snap = MicroserviceSnapshot(capacity, n, r, obj, tuple(history))
        alloc = np.asarray(policy.decide(snap, rng), dtype=int)
        times.append(time.perf_counter() - t0)
        true = float(graph.p99(alloc, loads[r])[0])
        observed = true * float(np.exp(noise * rng.standard_normal()))
        p99s.append(true)
        history.append((tuple(int(v) for v in alloc), -np.log(observed)))
        gp.update(features(alloc, loads[r])[0], -np.log(observed))
    return {"p99_ms": np.array(p99s) * 1e3, "decision_s": np.array(times)}


def run_microservices(raw: Mapping[str, Any], policies: list[str] | None) -> SimulationReport:
    """``kind: microservices`` scenarios: one row per policy with its mean P99 and the ratios of Fig. 3.12."""
    known_fields(raw, ("kind", "capacity", "rounds", "mean_load", "seeds", "policies"))
    capacity = integer(raw.get("capacity", 160), "capacity", minimum=MIN_CPUS_PER_SERVICE * len(HOTEL_SERVICES))
    if capacity > MAX_UNITS:
        raise ConfigError("capacity", capacity, f"at most {MAX_UNITS:,} CPUs")
    rounds = integer(raw.get("rounds", 180), "rounds", minimum=1)
    if rounds > MAX_ROUNDS:
        raise ConfigError("rounds", rounds, f"at most {MAX_ROUNDS:,} (ms-cilantro's GP keeps every round)")
    mean_load = positive(raw.get("mean_load", 1800.0), "mean_load", upper=MAX_RATE)
    seeds = seed_list(raw.get("seeds", [0]))
    names = policy_names(raw, policies, MicroservicePolicy.KINDS)
    made = [MicroservicePolicy(nm) for nm in names]
    rows, summary = [], {}
    for pol in made:
        res = [simulate_microservices(capacity, rounds, mean_load, MicroservicePolicy(pol.name), s) for s in seeds]
        row = {"policy": pol.name, "mean_p99_ms": float(np.mean([x["p99_ms"].mean() for x in res])),
               "last_third_p99_ms": float(np.mean([x["p99_ms"][2 * rounds // 3:].mean() for x in res])),
               "decision_ms": float(np.mean([x["decision_s"].mean() for x in res]) * 1e3)}
        rows.append(row)
        summary[f"{pol.name.replace('-', '_')}_mean_p99_ms"] = row["mean_p99_ms"]
    by = {r["policy"]: r["mean_p99_ms"] for r in rows}
    if "ms-cilantro" in by:
        others = [v for k, v in by.items() if k not in ("ms-cilantro", "ms-resource-fair")]
        if others:
            summary["ms_cilantro_vs_next_best"] = by["ms-cilantro"] / min(others)
        if "ms-resource-fair" in by:
            summary["ms_cilantro_vs_resource_fair"] = by["ms-cilantro"] / by["ms-resource-fair"]
    return SimulationReport("cilantro", rows, summary)
