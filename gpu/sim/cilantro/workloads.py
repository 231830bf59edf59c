"""Workloads of the Cilantro multi-tenant experiment (thesis ch. 3, §3.7, Fig. 3.7).

Loads the profiled performance curves and the Twitter load trace shipped in ``gpu/data/cilantro``
(MIT, from ``romilbhardwaj/cilantro``; see that folder's README) and builds the paper's 20-job
roster. Ground truth is ``p(a, ℓ) = interp(a/ℓ, grid, ests)`` with end clamping, as the authors'
oracles do; demand is ``interp(SLO, ests, grid) · ℓ``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.types import JobSpec

DATA = Path(__file__).resolve().parents[2] / "data" / "cilantro"
PROFILES = ("craydb0", "craydb1", "craymltrain", "craypredserv")
TRACE_MEDIAN = 2382.0

# The code's dummy workloads (the authors' code), x = resources per unit load.
SYNTHETIC: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "dataserving": lambda x: np.tanh(750.42 * x),
    "datacaching": lambda x: 1 - 1 / (1 + 623.45 * x),
    "inmemoryanalytics": lambda x: 1 - 1 / (1 + 919.67 * x),
    "dataanalytics": lambda x: 1 / (1 + np.exp(-(1129.92 * x - 9.1))),
    "websearch": lambda x: 1 / (1 + np.exp(-(1761.53 * x - 4.9))),
}


@dataclass(frozen=True, eq=False)
class Profile:
    """A workload's performance curve over ``x = a / ℓ`` plus the learner constants that go with it."""

    workload: str
    grid: np.ndarray
    ests: np.ndarray
    lip_const: float
    int_ub: float
    p50_load: float
    throughput: bool

    def perf(self, alloc: np.ndarray | float, load: np.ndarray | float) -> np.ndarray:
        """True (noise-free) performance at allocation ``alloc`` under load ``load``."""
        return np.interp(np.asarray(alloc, dtype=float) / np.maximum(load, 1e-12), self.grid, self.ests)

    def unit_demand(self, slo: float) -> float:
        """Smallest ``x`` whose performance reaches ``slo`` (the grid's end if it never does)."""
        return float(np.interp(slo, self.ests, self.grid))

    @property
    def perf_bounds(self) -> tuple[float, float]:
        """Range a learner may assume: fractions in [0, 1]; throughput in [0, ∞)."""
        return (0.0, np.inf) if self.throughput else (0.0, 1.0)


@lru_cache(maxsize=None)
def load_profile(workload: str) -> Profile:
    """One of the four profiled workloads (``craydb0``, ``craydb1``, ``craymltrain``, ``craypredserv``)."""
    if workload not in PROFILES:
        raise ConfigError("workload", workload, f"unknown; choose one of {list(PROFILES)} or {sorted(SYNTHETIC)}")
    raw = json.loads((DATA / f"{workload}.json").read_text())
    return Profile(workload, np.asarray(raw["grid"]), np.asarray(raw["ests"]), float(raw["lip_const"]),
                   float(raw["int_ub"]), float(raw["p50_load"]), workload == "craymltrain")


def synthetic_profile(workload: str, int_ub: float = 0.01, p50_load: float = 1000.0) -> Profile:
    """A code-style synthetic workload tabulated on 200 points of ``[0, int_ub]``."""
    if workload not in SYNTHETIC:
        raise ConfigError("workload", workload, f"unknown; choose one of {list(PROFILES)} or {sorted(SYNTHETIC)}")
    grid = np.linspace(0.0, int_ub, 200)
    ests = np.maximum.accumulate(SYNTHETIC[workload](grid))
    lip = float(np.max(np.diff(ests) / np.diff(grid)))
    return Profile(workload, grid, ests, lip, int_ub, p50_load, False)


def profile(workload: str) -> Profile:
    return synthetic_profile(workload) if workload in SYNTHETIC else load_profile(workload)


@lru_cache(maxsize=1)
def load_trace() -> np.ndarray:
    """The 1476-value Twitter arrival trace (raw counts)."""
    return np.array([float(v) for v in (DATA / "twitter_1476_data").read_text().split()])


def load_series(workload: Profile, steps: int, offset: int) -> np.ndarray:
    """Per-report loads: the trace played forwards then backwards from ``offset``, scaled to the profile's median."""
    if workload.throughput:
        return np.ones(steps)
    trace = load_trace()
    pingpong = np.concatenate([trace, trace[::-1]])
    idx = (offset + np.arange(steps)) % len(pingpong)
    return pingpong[idx] * workload.p50_load / TRACE_MEDIAN


# name, workload, SLO threshold, utility shape (code: env_gen.generate_env_exp_env_1)
PAPER_ROSTER: tuple[tuple[str, str, float, str], ...] = (
    ("db0j1", "craydb0", 0.9, "linear"), ("db0j2", "craydb0", 0.9, "linear"), ("db0j3", "craydb0", 0.95, "sqrt"),
    ("db1j1", "craydb1", 0.9, "linear"), ("db1j2", "craydb1", 0.9, "quadratic"),
    ("db1j3", "craydb1", 0.95, "quadratic"), ("db1j4", "craydb1", 0.95, "linear"),
    ("db1j5", "craydb1", 0.95, "quadratic"), ("db1j6", "craydb1", 0.99, "quadratic"),
    ("db1j7", "craydb1", 0.99, "sqrt"),
    ("mltj1", "craymltrain", 400.0, "sqrt"), ("mltj2", "craymltrain", 400.0, "sqrt"),
    ("mltj3", "craymltrain", 450.0, "linear"), ("mltj4", "craymltrain", 450.0, "linear"),
    ("mltj5", "craymltrain", 500.0, "quadratic"), ("mltj6", "craymltrain", 500.0, "quadratic"),
    ("mltj7", "craymltrain", 500.0, "quadratic"),
    ("prsj1", "craypredserv", 0.9, "linear"), ("prsj2", "craypredserv", 0.9, "sqrt"),
    ("prsj3", "craypredserv", 0.95, "sqrt"),
)


def paper_jobs() -> list[JobSpec]:
    """The 20 jobs of Table 3.2 (10 DB, 7 ML training, 3 prediction serving)."""
    return [JobSpec(name, slo, shape, 1.0, wl) for name, wl, slo, shape in PAPER_ROSTER]
