"""Ekya's baselines: the uniform scheduler and the two ablations of Fig. 2.10a.

Paper: Ekya thesis Chapter 2, §2.6 "Baselines" and "Component-wise contribution":

- *Uniform (Cfg X, Y%)*: every stream gets ``G/|V|`` GPUs, Y% of it for inference and the rest for
  retraining with the fixed config X, whatever it costs (prior cluster/video schedulers).
- *Ekya-FixedRes*: uniform's static partition (50/50), but PickConfigs chooses the configs.
- *Ekya-FixedConfig*: the thief allocates, but every stream may only use the fixed config X.

All three return the same ``EkyaDecision`` as the thief so simulators and flows treat them alike.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from gpu.errors import ConfigError
from gpu.schedulers.ekya.thief import (EkyaDecision, EkyaParams, StreamState, _check_inputs, _decision, estimate_accuracy,
                                 infer_job, pick_configs, thief_schedule, train_job)


def _config(stream: StreamState, name: str):
    for cfg in stream.configs:
        if cfg.name == name:
            return cfg
    raise ConfigError("config", name, f"stream {stream.name!r} has no retraining config of that name "
                                      f"(has {[c.name for c in stream.configs]})")


def _check_share(inference_share: float) -> None:
    if isinstance(inference_share, bool) or not isinstance(inference_share, (int, float)) \
            or not 0.0 < inference_share <= 1.0:
        raise ConfigError("inference_share", inference_share, "must be in (0, 1]")


def uniform_partition(streams: Sequence[StreamState], gpus: float, inference_share: float) -> dict[str, float]:
    """Job id -> GPUs: ``gpus/|V|`` per stream, ``inference_share`` of it to inference."""
    _check_share(inference_share)
    per_stream = gpus / len(streams)
    out: dict[str, float] = {}
    for s in streams:
        retrains = bool(s.configs) and s.running is None and inference_share < 1.0
        out[infer_job(s.name)] = per_stream * (inference_share if retrains else 1.0)
        if retrains:
            out[train_job(s.name)] = per_stream * (1.0 - inference_share)
    return out


def uniform_schedule(streams: Sequence[StreamState], gpus: float, window_s: float, config: str,
                     inference_share: float, params: EkyaParams = EkyaParams()) -> EkyaDecision:
    """Uniform (Cfg ``config``, ``inference_share``): fixed config, static split, no per-job cap.

    A retraining that cannot finish within the window is still started (its ``retrain_s`` exceeds
    ``window_s``); the simulator discards it at the window end.
    """
    _check_inputs(streams, gpus, window_s)
    alloc = uniform_partition(streams, gpus, inference_share)
    free = dataclasses.replace(params, max_job_gpus=None)
    chosen = [estimate_accuracy(s, _config(s, config) if train_job(s.name) in alloc else None,
                                alloc[infer_job(s.name)], alloc.get(train_job(s.name), 0.0), window_s, free)
              for s in streams]
    return _decision(chosen, gpus, window_s, 0)


def fixed_res_schedule(streams: Sequence[StreamState], gpus: float, window_s: float,
                       params: EkyaParams = EkyaParams(), inference_share: float = 0.5) -> EkyaDecision:
    """Ekya-FixedRes: uniform's static partition, configs chosen by PickConfigs (Algorithm 2)."""
    _check_inputs(streams, gpus, window_s)
    free = dataclasses.replace(params, max_job_gpus=None)
    return pick_configs(streams, uniform_partition(streams, gpus, inference_share), gpus, window_s, free)


def fixed_config_schedule(streams: Sequence[StreamState], gpus: float, window_s: float, config: str,
                          params: EkyaParams = EkyaParams(), start: Mapping[str, float] | None = None) -> EkyaDecision:
    """Ekya-FixedConfig: the thief scheduler restricted to the one config ``config`` (or none)."""
    _check_inputs(streams, gpus, window_s)
    only = [dataclasses.replace(s, configs=(_config(s, config),)) if s.configs else s for s in streams]
    return thief_schedule(only, gpus, window_s, params, start)
