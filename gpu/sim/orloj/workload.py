"""ORLOJ simulator inputs: per-application execution-time distributions and the scenario file.

The thesis's synthetic workloads (§4.5.1, Tables C.1–C.3) are mixtures of normal distributions whose units and
mode locations it does not give; we use a 10 ms unit with the short mode at 50 ms and mode ``j`` at
``50·j`` ms, each mode one application (the thesis groups "short-running and relatively long-running requests"
of a dataset, one application per group), truncated at 1 ms. Its real tasks (Table 4.1) enter as log-normal
proxies with the table's mean and P99. A batch's time comes from a measured dynamic DNN by default
(``cost: {model: measured}``, ``gpu.sim.orloj.batch_cost``) or from Eq. 4.3 with a chosen overhead
(``cost: {model: eq43}``). Scenario format: ``docs/orloj.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from gpu.errors import ConfigError
from gpu.scenario import (MAX_BATCH, MAX_EVENTS, MAX_FACTOR, MAX_MS, MAX_SECONDS, MAX_SEEDS, entries, fraction,
                          integer, label, load_scenario, names, positive, require, section)
from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.schedulers.orloj.policies import POLICIES
from gpu.sim.orloj.batch_cost import DEFAULT_PROFILE, NETWORK, DepthProfile, load_profile

Z99 = 2.3263478740408408  # the standard normal's 99th percentile
MAX_SLO_MULTIPLIER = 1_000.0  # an SLO of 1,000 x the p99 alone time: no batch policy decides anything any more
MAX_LOAD = 100.0  # offered load in units of the largest batch's throughput
MAX_BINS = 100_000  # histogram bins per application
MIN_MS = 1.0  # the synthetic distributions are truncated here


@dataclass(frozen=True)
class AppDistribution:
    """One application's alone (batch-of-one) execution time, ms: ``normal``, ``lognormal`` or ``constant``."""

    app_id: str
    kind: str
    mean_ms: float
    spread_ms: float = 0.0  # normal: std; lognormal: P99; constant: unused

    def sample(self, rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
        if self.kind == "normal":
            x = np.maximum(rng.normal(self.mean_ms, self.spread_ms, n), MIN_MS)
        elif self.kind == "lognormal":
            sigma = lognormal_sigma(self.mean_ms, self.spread_ms)
            x = rng.lognormal(math.log(self.mean_ms) - sigma ** 2 / 2, sigma, n)
        else:
            x = np.full(n, self.mean_ms)
        return scale * x


def lognormal_sigma(mean_ms: float, p99_ms: float) -> float:
    """σ of the log-normal with this mean and P99: the smaller root of ``σ²/2 − z₉₉σ + ln(P99/mean) = 0``."""
    disc = Z99 ** 2 - 2 * math.log(p99_ms / mean_ms)
    if p99_ms <= mean_ms or disc < 0:
        raise ConfigError("lognormal.p99_ms", p99_ms, f"needs mean < P99 <= {mean_ms * math.exp(Z99 ** 2 / 2):.4g}")
    return Z99 - math.sqrt(disc)


@dataclass(frozen=True)
class Case:
    """One workload (a table row group of the thesis): applications sharing one model, equal request rates."""

    name: str
    apps: tuple[AppDistribution, ...]
    scale: float = 1.0  # multiplies every time (Fig. 4.14 scales a distribution down)
    overhead_ms: float = 0.0  # added to every alone time: the batch-independent part of a forward pass

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` requests: each application's index (uniform) and its alone time."""
        which = rng.integers(len(self.apps), size=n)
        alone = np.empty(n)
        for i, app in enumerate(self.apps):
            mask = which == i
            alone[mask] = app.sample(rng, int(mask.sum()), self.scale)
        return which, alone + self.scale * self.overhead_ms


COST_MODELS = ("measured", "eq43")


@dataclass(frozen=True)
class CostSpec:
    """How a batch's time follows from its requests' alone times (``docs/orloj.md``, "Execution model").

    ``measured`` (default): the timed ``network`` of the ``profile`` table, its depth range spread over the
    case's alone times (``gpu.sim.orloj.batch_cost``). ``eq43``: Eq. 4.3 as printed, ``c0 = c0_fraction`` × P1 of
    the alone times, with ``overhead_ms`` of chosen batch-independent work added to every alone time.
    """

    model: str = "measured"
    profile: str = str(DEFAULT_PROFILE)
    network: str = NETWORK
    c0_fraction: float = 0.9
    overhead_ms: float = 0.0

    def batch_model(self, alone_ms: np.ndarray) -> PaddedBatchModel:
        """The batch model of a case whose alone times are ``alone_ms`` (a large sample of them)."""
        if self.model == "eq43":
            return PaddedBatchModel(self.c0_fraction * float(np.percentile(alone_ms, 1)))
        return _profile(self.profile, self.network).model(float(np.percentile(alone_ms, 99)))


@lru_cache(maxsize=8)
def _profile(path: str, network: str) -> DepthProfile:
    return load_profile(path, network)


@dataclass(frozen=True)
class OrlojScenario:
    """A parsed scenario: cases × SLO multipliers × policies × seeds on one worker (``docs/orloj.md``)."""

    name: str
    cases: tuple[Case, ...]
    slo_multipliers: tuple[float, ...] = (1.5, 2.0, 3.0, 4.0, 5.0)
    policies: tuple[str, ...] = POLICIES
    seeds: int = 5
    duration_s: float = 60.0
    requests: int | None = None  # when set, each case runs for this many expected arrivals instead
    load: float = 0.8  # × the system's capacity: the best batch throughput of the true batch costs
    cost: CostSpec = CostSpec()
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    b: float = 1e-4
    mix: str = "round_robin"
    bins: int = 200
    profiler: str = "warm"  # warm: ORLOJ starts with the true histograms; online: from a cold profile, learning
    epoch_s: float = 10.0  # online: how often the controller's on_epoch picks the profiler's histograms up


_TOP = {"name", "cases", "slo_multipliers", "policies", "seeds", "duration_s", "requests", "load", "cost",
        "batch_sizes", "orloj"}


def _cost(raw: Any, base: Path | None) -> CostSpec:
    """The ``cost`` section; a relative profile path is read next to the scenario file."""
    c = section(raw, "cost", {"model", "profile", "network", "c0_fraction", "overhead_ms"})
    model = c.get("model", "measured")
    if model not in COST_MODELS:
        raise ConfigError("cost.model", model, f"choose one of {list(COST_MODELS)}")
    if model == "eq43":
        extra = sorted(set(c) & {"profile", "network"})
        if extra:
            raise ConfigError(f"cost.{extra[0]}", c[extra[0]], "only a measured cost reads a profile")
        return CostSpec("eq43", c0_fraction=fraction(c.get("c0_fraction", 0.9), "cost.c0_fraction"),
                        overhead_ms=positive(c.get("overhead_ms", 0.0), "cost.overhead_ms", allow_zero=True,
                                             upper=MAX_MS))
    extra = sorted(set(c) & {"c0_fraction", "overhead_ms"})
    if extra:
        raise ConfigError(f"cost.{extra[0]}", c[extra[0]], "a measured cost takes c0 from its profile: "
                                                           "use model: eq43 to choose it")
    path = Path(label(c.get("profile", str(DEFAULT_PROFILE)), "cost.profile"))
    if not path.is_absolute() and base is not None and (base / path).exists():
        path = base / path
    spec = CostSpec("measured", str(path), label(c.get("network", NETWORK), "cost.network"))
    _profile(spec.profile, spec.network)  # a missing or malformed table fails here, before any run
    return spec


def _app(raw: dict[str, Any], where: str) -> AppDistribution:
    app_id = label(require(raw, "id", f"{where}."), f"{where}.id")
    kinds = [k for k in ("normal", "lognormal", "constant_ms") if k in raw]
    if len(kinds) != 1:
        raise ConfigError(where, raw, "give exactly one of normal, lognormal, constant_ms")
    if kinds[0] == "constant_ms":
        return AppDistribution(app_id, "constant", positive(raw["constant_ms"], f"{where}.constant_ms", upper=MAX_MS))
    if kinds[0] == "normal":
        n = section(raw["normal"], f"{where}.normal", {"mean_ms", "std_ms"}, optional=False)
        return AppDistribution(app_id, "normal", positive(require(n, "mean_ms", f"{where}.normal."),
                                                          f"{where}.normal.mean_ms", upper=MAX_MS),
                               positive(require(n, "std_ms", f"{where}.normal."), f"{where}.normal.std_ms", upper=MAX_MS))
    ln = section(raw["lognormal"], f"{where}.lognormal", {"mean_ms", "p99_ms"}, optional=False)
    mean = positive(require(ln, "mean_ms", f"{where}.lognormal."), f"{where}.lognormal.mean_ms", upper=MAX_MS)
    p99 = positive(require(ln, "p99_ms", f"{where}.lognormal."), f"{where}.lognormal.p99_ms", upper=MAX_MS)
    lognormal_sigma(mean, p99)
    return AppDistribution(app_id, "lognormal", mean, p99)


def parse(raw: dict[str, Any], source: str = "scenario", base: Path | None = None) -> OrlojScenario:
    """Validate a scenario mapping (``base``: the folder relative paths are read from); every bad value is a
    ConfigError naming its field."""
    section(raw, source, _TOP, optional=False)
    cases = []
    for i, c in enumerate(entries(require(raw, "cases"), "cases", {"name", "apps", "scale"})):
        where = f"cases[{i}]"
        apps = tuple(_app(a, f"{where}.apps[{j}]")
                     for j, a in enumerate(entries(require(c, "apps", f"{where}."), f"{where}.apps",
                                                   {"id", "normal", "lognormal", "constant_ms"})))
        if not apps:
            raise ConfigError(f"{where}.apps", [], "a case needs at least one application")
        if len({a.app_id for a in apps}) != len(apps):
            raise ConfigError(f"{where}.apps", [a.app_id for a in apps], "application ids must be unique")
        cases.append(Case(label(require(c, "name", f"{where}."), f"{where}.name"), apps,
                          positive(c.get("scale", 1.0), f"{where}.scale", upper=MAX_FACTOR)))
    if not cases:
        raise ConfigError("cases", [], "a scenario needs at least one case")
    cost = _cost(raw.get("cost"), base)
    cases = [Case(c.name, c.apps, c.scale, cost.overhead_ms) for c in cases]
    orloj = section(raw.get("orloj"), "orloj", {"b", "mix", "bins", "profiler", "epoch_s"})
    if orloj.get("profiler", "warm") not in ("warm", "online"):
        raise ConfigError("orloj.profiler", orloj["profiler"], "choose 'warm' or 'online'")
    multipliers = tuple(positive(m, f"slo_multipliers[{i}]", upper=MAX_SLO_MULTIPLIER)
                        for i, m in enumerate(raw.get("slo_multipliers",
                                                                                             [1.5, 2, 3, 4, 5])))
    policies = tuple(names(raw.get("policies", list(POLICIES)), "policies"))
    for p in policies:
        if p not in POLICIES:
            raise ConfigError("policies", p, f"unknown; choose from {list(POLICIES)}")
    sizes = tuple(integer(b, f"batch_sizes[{i}]", 1, MAX_BATCH)
                  for i, b in enumerate(raw.get("batch_sizes", [1, 2, 4, 8, 16])))
    if not multipliers or not sizes or not policies:
        raise ConfigError("slo_multipliers", multipliers, "need SLO multipliers, batch sizes and policies")
    return OrlojScenario(
        name=label(raw.get("name", source), "name"), cases=tuple(cases), slo_multipliers=multipliers,
        policies=policies, seeds=integer(raw.get("seeds", 5), "seeds", 1, MAX_SEEDS),
        duration_s=positive(raw.get("duration_s", 60.0), "duration_s", upper=MAX_SECONDS),
        requests=None if raw.get("requests") is None else integer(raw["requests"], "requests", 1, MAX_EVENTS),
        load=positive(raw.get("load", 0.8), "load", upper=MAX_LOAD), cost=cost, batch_sizes=tuple(sorted(set(sizes))),
        b=positive(orloj.get("b", 1e-4), "orloj.b", upper=1.0), mix=label(orloj.get("mix", "round_robin"), "orloj.mix"),
        bins=integer(orloj.get("bins", 200), "orloj.bins", 2, MAX_BINS), profiler=orloj.get("profiler", "warm"),
        epoch_s=positive(orloj.get("epoch_s", 10.0), "orloj.epoch_s", upper=MAX_SECONDS))


def load(path: str) -> OrlojScenario:
    return parse(load_scenario(path), str(path), Path(path).resolve().parent)


__all__ = ["AppDistribution", "Case", "CostSpec", "OrlojScenario", "load", "lognormal_sigma", "parse"]
