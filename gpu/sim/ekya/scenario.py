"""The Ekya scenario format (docs/ekya.md): a pool, a window, and per-stream, per-window profiles.

A scenario is the simulator's trace (thesis §2.5 "trace-driven simulator"): for every stream and
retraining window, the deployed model's starting accuracy, the drift that a previously retrained
model suffers, and the retraining configs with their post-retraining accuracy and GPU-seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from gpu.errors import ConfigError
from gpu.scenario import (MAX_FACTOR, MAX_GPUS, MAX_SECONDS, flag, fraction, integer, known_fields, load_scenario, mapping,
                          number, policy_names, positive, require)
from gpu.schedulers.ekya.thief import EkyaParams, InferenceProfile, RetrainConfig

DEFAULT_POLICIES = ("thief", "uniform_cfg1_50")


@dataclass(frozen=True)
class WindowSpec:
    """One stream in one window: stale-model accuracy, drift of a retrained model, configs."""

    start_accuracy: float
    configs: tuple[RetrainConfig, ...]
    drift: float = 0.0


@dataclass(frozen=True)
class ScenarioStream:
    name: str
    inference: InferenceProfile
    windows: tuple[WindowSpec, ...]


@dataclass(frozen=True)
class EkyaScenario:
    """A parsed scenario; ``streams[k].windows`` all have the same length."""

    gpus: float
    window_s: float
    params: EkyaParams
    streams: tuple[ScenarioStream, ...]
    policies: tuple[str, ...] = DEFAULT_POLICIES

    @property
    def n_windows(self) -> int:
        return len(self.streams[0].windows)

    def to_dict(self) -> dict[str, Any]:
        """The scenario as the plain mapping ``parse_scenario`` reads (for writing YAML/JSON)."""
        p = self.params
        return {
            "gpus": self.gpus, "window_s": self.window_s, "a_min": p.a_min, "delta": p.delta,
            "penalty": p.penalty, "max_job_gpus": p.max_job_gpus, "retrain_scaling": p.retrain_scaling,
            "start_splits": p.start_splits,
            "max_passes": p.max_passes, "policies": list(self.policies),
            "streams": [{
                "name": s.name,
                "inference": {"full_rate_gpus": s.inference.full_rate_gpus,
                              "points": [list(pt) for pt in s.inference.points]},
                "windows": [{"start_accuracy": w.start_accuracy, "drift": w.drift,
                             "configs": [{"name": c.name, "accuracy": c.accuracy, "gpu_seconds": c.gpu_seconds}
                                         for c in w.configs]} for w in s.windows],
            } for s in self.streams],
        }


MAX_QUANTA = 100_000  # gpus / delta: the thief's steal quanta
MAX_PASSES = 1_000  # thief passes
SCENARIO_KEYS = ("gpus", "window_s", "a_min", "delta", "penalty", "max_job_gpus", "retrain_scaling", "start_splits",
                 "max_passes", "policies", "inference", "streams")




def _points(raw: Any, where: str) -> tuple[tuple[float, float], ...]:
    """``[[rate, relative_accuracy], ...]`` with finite numbers (the ordering rules are InferenceProfile's)."""
    if not isinstance(raw, list):
        raise ConfigError(where, raw, "must be a list of [rate, relative_accuracy]")
    out = []
    for k, pt in enumerate(raw):
        if not isinstance(pt, list) or len(pt) != 2:
            raise ConfigError(f"{where}[{k}]", pt, "must be a pair [rate, relative_accuracy]")
        out.append((number(pt[0], f"{where}[{k}][0]"), number(pt[1], f"{where}[{k}][1]")))
    return tuple(out)


def _inference(raw: Any, where: str, default: InferenceProfile) -> InferenceProfile:
    if raw is None:
        return default
    raw = mapping(raw, where, optional=False)
    known_fields(raw, ("full_rate_gpus", "points"), f"{where}.")
    full = positive(raw.get("full_rate_gpus", default.full_rate_gpus), f"{where}.full_rate_gpus", upper=MAX_GPUS)
    points = _points(raw["points"], f"{where}.points") if "points" in raw else default.points
    try:
        return InferenceProfile(full, points)
    except ConfigError as exc:  # InferenceProfile names "inference.points"; say which stream's profile it is
        raise ConfigError(f"{where}.points", raw.get("points"), str(exc).split(": ", 1)[-1]) from None


def _window(raw: Any, where: str) -> WindowSpec:
    raw = mapping(raw, where, optional=False)
    known_fields(raw, ("start_accuracy", "drift", "configs"), f"{where}.")
    start = fraction(require(raw, "start_accuracy", f"{where}."), f"{where}.start_accuracy")
    drift = fraction(raw.get("drift", 0.0), f"{where}.drift")
    configs_raw = raw.get("configs", [])
    if not isinstance(configs_raw, list):
        raise ConfigError(f"{where}.configs", configs_raw, "must be a list")
    configs = []
    for k, c in enumerate(configs_raw):
        cw = f"{where}.configs[{k}]"
        c = mapping(c, cw, optional=False)
        known_fields(c, ("name", "accuracy", "gpu_seconds"), f"{cw}.")
        name = require(c, "name", f"{cw}.")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{cw}.name", name, "must be a non-empty string")
        configs.append(RetrainConfig(name, fraction(require(c, "accuracy", f"{cw}."), f"{cw}.accuracy"),
                                     positive(require(c, "gpu_seconds", f"{cw}."), f"{cw}.gpu_seconds",
                                              upper=MAX_SECONDS)))
    config_names = [c.name for c in configs]
    if len(set(config_names)) != len(config_names):
        raise ConfigError(f"{where}.configs", config_names, "config names must be unique")
    return WindowSpec(start, tuple(configs), drift)


def _stream(raw: Any, i: int, default_inf: InferenceProfile) -> ScenarioStream:
    where = f"streams[{i}]"
    raw = mapping(raw, where, optional=False)
    known_fields(raw, ("name", "inference", "windows"), f"{where}.")
    name = raw.get("name", f"s{i}")
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(f"{where}.name", name, "must be a non-empty string without '/'")
    windows_raw = require(raw, "windows", f"{where}.")
    if not isinstance(windows_raw, list) or not windows_raw:
        raise ConfigError(f"{where}.windows", windows_raw, "must be a non-empty list")
    windows = tuple(_window(w, f"{where}.windows[{k}]") for k, w in enumerate(windows_raw))
    return ScenarioStream(name, _inference(raw.get("inference"), f"{where}.inference", default_inf), windows)


def parse_scenario(raw: Mapping[str, Any]) -> EkyaScenario:
    """Validate a scenario mapping; every error names the offending field."""
    known_fields(raw, SCENARIO_KEYS, "")
    gpus = positive(require(raw, "gpus"), "gpus", upper=MAX_GPUS)
    window_s = positive(require(raw, "window_s"), "window_s", upper=MAX_SECONDS)
    cap = raw.get("max_job_gpus", 1.0)
    delta = positive(raw.get("delta", 0.1), "delta", upper=MAX_GPUS)
    if gpus / delta > MAX_QUANTA:  # the thief moves delta at a time: its work grows with gpus / delta
        raise ConfigError("delta", delta, f"gpus / delta = {gpus / delta:,.0f} steal quanta; at most {MAX_QUANTA:,}")
    params = EkyaParams(
        delta=delta, a_min=fraction(raw.get("a_min", 0.0), "a_min"),
        penalty=positive(raw.get("penalty", 10.0), "penalty", allow_zero=True, upper=MAX_FACTOR),
        max_job_gpus=None if cap is None else positive(cap, "max_job_gpus", upper=MAX_GPUS),
        max_passes=integer(raw.get("max_passes", 3), "max_passes", minimum=1, maximum=MAX_PASSES),
        retrain_scaling=positive(raw.get("retrain_scaling", 1.0), "retrain_scaling", upper=1.0),
        start_splits=flag(raw.get("start_splits", False), "start_splits"))
    default_inf = _inference(raw.get("inference"), "inference", InferenceProfile())
    streams_raw = require(raw, "streams")
    if not isinstance(streams_raw, list) or not streams_raw:
        raise ConfigError("streams", streams_raw, "must be a non-empty list")
    streams = [_stream(s, i, default_inf) for i, s in enumerate(streams_raw)]
    lengths = {len(s.windows) for s in streams}
    if len(lengths) != 1:
        raise ConfigError("streams[].windows", sorted(lengths), "every stream needs the same number of windows")
    stream_names = [s.name for s in streams]
    if len(set(stream_names)) != len(stream_names):
        raise ConfigError("streams[].name", stream_names, "names must be unique")
    policies = policy_names(raw, None, DEFAULT_POLICIES)
    return EkyaScenario(gpus, window_s, params, tuple(streams), tuple(policies))


def load(path: str | Path) -> EkyaScenario:
    """Read and validate a JSON/YAML Ekya scenario file."""
    return parse_scenario(load_scenario(path))
