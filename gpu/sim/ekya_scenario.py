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
from gpu.scenario import fraction, load_scenario, positive, require
from gpu.schedulers.ekya import EkyaParams, InferenceProfile, RetrainConfig

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


def _inference(raw: Any, where: str, default: InferenceProfile) -> InferenceProfile:
    if raw is None:
        return default
    if not isinstance(raw, Mapping):
        raise ConfigError(where, raw, "must be a mapping with full_rate_gpus and points")
    full = positive(raw.get("full_rate_gpus", default.full_rate_gpus), f"{where}.full_rate_gpus")
    try:
        return InferenceProfile(full, tuple(tuple(pt) for pt in raw.get("points", default.points)))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise ConfigError(f"{where}.points", raw.get("points"), str(exc).split(": ", 1)[-1]) from None
        raise ConfigError(f"{where}.points", raw.get("points"), "must be a list of [rate, relative_accuracy]") from None


def _window(raw: Any, where: str) -> WindowSpec:
    if not isinstance(raw, Mapping):
        raise ConfigError(where, raw, "must be a mapping")
    start = fraction(require(raw, "start_accuracy", f"{where}."), f"{where}.start_accuracy")
    drift = fraction(raw.get("drift", 0.0), f"{where}.drift")
    configs_raw = raw.get("configs", [])
    if not isinstance(configs_raw, list):
        raise ConfigError(f"{where}.configs", configs_raw, "must be a list")
    configs = []
    for k, c in enumerate(configs_raw):
        cw = f"{where}.configs[{k}]"
        if not isinstance(c, Mapping):
            raise ConfigError(cw, c, "must be a mapping with name, accuracy, gpu_seconds")
        name = require(c, "name", f"{cw}.")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{cw}.name", name, "must be a non-empty string")
        configs.append(RetrainConfig(name, fraction(require(c, "accuracy", f"{cw}."), f"{cw}.accuracy"),
                                     positive(require(c, "gpu_seconds", f"{cw}."), f"{cw}.gpu_seconds")))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.configs", names, "config names must be unique")
    return WindowSpec(start, tuple(configs), drift)


def parse_scenario(raw: Mapping[str, Any]) -> EkyaScenario:
    """Validate a scenario mapping; every error names the offending field."""
    gpus = positive(require(raw, "gpus"), "gpus")
    window_s = positive(require(raw, "window_s"), "window_s")
    cap = raw.get("max_job_gpus", 1.0)
    params = EkyaParams(
        delta=positive(raw.get("delta", 0.1), "delta"), a_min=fraction(raw.get("a_min", 0.0), "a_min"),
        penalty=positive(raw.get("penalty", 10.0), "penalty", allow_zero=True),
        max_job_gpus=None if cap is None else positive(cap, "max_job_gpus"),
        max_passes=raw.get("max_passes", 3), retrain_scaling=raw.get("retrain_scaling", 1.0),
        start_splits=raw.get("start_splits", True))
    default_inf = _inference(raw.get("inference"), "inference", InferenceProfile())
    streams_raw = require(raw, "streams")
    if not isinstance(streams_raw, list) or not streams_raw:
        raise ConfigError("streams", streams_raw, "must be a non-empty list")
    streams = []
    for i, s in enumerate(streams_raw):
        where = f"streams[{i}]"
        if not isinstance(s, Mapping):
            raise ConfigError(where, s, "must be a mapping")
        name = str(s.get("name", f"s{i}"))
        windows_raw = require(s, "windows", f"{where}.")
        if not isinstance(windows_raw, list) or not windows_raw:
            raise ConfigError(f"{where}.windows", windows_raw, "must be a non-empty list")
        windows = tuple(_window(w, f"{where}.windows[{k}]") for k, w in enumerate(windows_raw))
        streams.append(ScenarioStream(name, _inference(s.get("inference"), f"{where}.inference", default_inf), windows))
    lengths = {len(s.windows) for s in streams}
    if len(lengths) != 1:
        raise ConfigError("streams[].windows", sorted(lengths), "every stream needs the same number of windows")
    names = [s.name for s in streams]
    if len(set(names)) != len(names) or any(not n or "/" in n for n in names):
        raise ConfigError("streams[].name", names, "names must be unique, non-empty and without '/'")
    policies = raw.get("policies", list(DEFAULT_POLICIES))
    if not isinstance(policies, list) or not policies or not all(isinstance(p, str) for p in policies):
        raise ConfigError("policies", policies, "must be a non-empty list of policy names")
    return EkyaScenario(gpus, window_s, params, tuple(streams), tuple(policies))


def load(path: str | Path) -> EkyaScenario:
    """Read and validate a JSON/YAML Ekya scenario file."""
    return parse_scenario(load_scenario(path))
