"""Search spaces: what a tuning algorithm may try, and how configs are drawn from it.

Grid and random variants come from Ray Tune's own variant generator
(``ray.tune.search.variant_generator.generate_variants``, imported lazily so ``gpu`` imports without Ray):
our plain domain objects are translated to ``tune.grid_search``/``tune.choice``/``tune.uniform``/
``tune.loguniform`` and Ray expands grids and samples random axes with our seeded ``np.random.Generator``.
The unit-cube encoding (``encode``/``decode``) is what BOHB's density model and PBT's perturbation use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Union

import numpy as np

from gpu.errors import ConfigError
from gpu.scenario import number


@dataclass(frozen=True)
class Grid:
    """Every value is tried (cross product with other Grid axes); random sampling treats it as a choice."""

    values: tuple


@dataclass(frozen=True)
class Choice:
    values: tuple


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float


@dataclass(frozen=True)
class LogUniform:
    low: float
    high: float


Domain = Union[Grid, Choice, Uniform, LogUniform]
Space = Mapping[str, Any]  # name -> Domain or a constant


def parse_space(raw: Mapping[str, Any], field: str = "space") -> dict[str, Any]:
    """Build a space from plain data: ``{"lr": {"loguniform": [1e-4, 0.1]}, "bs": {"grid": [32, 64]}, "x": 3}``.

    Every malformed entry is a ConfigError naming ``<field>.<param>``: it would otherwise surface as a TypeError
    from a domain's constructor or from comparing its bounds, deep inside a tuning run.
    """
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(field, raw, "the search space needs at least one parameter")
    return validate_space({name: _domain(spec, f"{field}.{name}") for name, spec in raw.items()}, field)


_KINDS = {"grid": Grid, "choice": Choice, "uniform": Uniform, "loguniform": LogUniform}


def _domain(spec: Any, where: str) -> Any:
    """One parameter: ``{kind: [args]}`` or a constant (a number, a string, true/false, null)."""
    if not isinstance(spec, Mapping):
        return _value(spec, where)
    if len(spec) != 1 or next(iter(spec)) not in _KINDS:
        raise ConfigError(where, dict(spec), f"use exactly one of {sorted(_KINDS)}, e.g. {{uniform: [0.1, 1]}}")
    kind, args = next(iter(spec.items()))
    if not isinstance(args, (list, tuple)) or not args:
        raise ConfigError(f"{where}.{kind}", args, "must be a non-empty list")
    if kind in ("grid", "choice"):
        return _KINDS[kind](tuple(_value(v, f"{where}.{kind}[{i}]") for i, v in enumerate(args)))
    if len(args) != 2:
        raise ConfigError(f"{where}.{kind}", args, "must be [low, high]")
    return _KINDS[kind](*(number(v, f"{where}.{kind}[{i}]") for i, v in enumerate(args)))


def _value(value: Any, where: str) -> Any:
    """A value a trial's config may hold: configs are compared, hashed and logged as parameters."""
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise ConfigError(where, value, "must be a number, a string, true/false or null")
    return value


def validate_space(space: Space, field: str = "space") -> dict[str, Any]:
    """Check bounds and emptiness; return the space as a dict."""
    if not space:
        raise ConfigError(field, dict(space), "the search space needs at least one parameter")
    for name, dom in space.items():
        if isinstance(dom, (Grid, Choice)) and not dom.values:
            raise ConfigError(f"{field}.{name}", list(dom.values), "needs at least one value")
        if isinstance(dom, (Uniform, LogUniform)) and not dom.low < dom.high:
            raise ConfigError(f"{field}.{name}", (dom.low, dom.high), "low must be < high")
        if isinstance(dom, LogUniform) and not dom.low > 0:
            raise ConfigError(f"{field}.{name}", (dom.low, dom.high), "log-uniform bounds must be > 0")
    return dict(space)


def _to_ray(space: Space, grid: bool) -> dict[str, Any]:
    from ray.tune.search.sample import choice, loguniform, uniform
    from ray.tune.search.variant_generator import grid_search

    out: dict[str, Any] = {}
    for name, dom in space.items():
        if isinstance(dom, Grid):
            out[name] = grid_search(list(dom.values)) if grid else choice(list(dom.values))
        elif isinstance(dom, Choice):
            out[name] = choice(list(dom.values))
        elif isinstance(dom, Uniform):
            out[name] = uniform(dom.low, dom.high)
        elif isinstance(dom, LogUniform):
            out[name] = loguniform(dom.low, dom.high)
        else:
            out[name] = dom
    return out


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in config.items()}


def variants(space: Space, num_samples: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Ray Tune's expansion: the Grid cross product, repeated ``num_samples`` times with random axes drawn."""
    from ray.tune.search.variant_generator import generate_variants

    if num_samples < 1:
        raise ConfigError("num_samples", num_samples, "must be >= 1")
    spec = _to_ray(validate_space(space), grid=True)
    return [_plain(cfg) for _ in range(num_samples) for _, cfg in generate_variants(spec, random_state=rng)]


def sample(space: Space, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """``n`` random configs (Grid axes drawn like choices), via Ray Tune's samplers."""
    from ray.tune.search.variant_generator import generate_variants

    spec = _to_ray(validate_space(space), grid=False)
    return [_plain(cfg) for _ in range(n) for _, cfg in generate_variants(spec, random_state=rng)]


def _numeric(space: Space) -> list[str]:
    return [k for k, d in space.items() if isinstance(d, (Grid, Choice, Uniform, LogUniform))]


def dimensions(space: Space) -> int:
    """How many coordinates ``encode`` produces (constants are not encoded)."""
    return len(_numeric(space))


def encode(space: Space, config: Mapping[str, Any]) -> np.ndarray:
    """Config -> point in ``[0, 1]^D`` (categoricals by index, log-uniform in log space)."""
    x = []
    for k in _numeric(space):
        d, v = space[k], config[k]
        if isinstance(d, (Grid, Choice)):
            x.append(d.values.index(v) / max(1, len(d.values) - 1))
        elif isinstance(d, Uniform):
            x.append((v - d.low) / (d.high - d.low))
        else:
            x.append((math.log(v) - math.log(d.low)) / (math.log(d.high) - math.log(d.low)))
    return np.clip(np.asarray(x, dtype=float), 0.0, 1.0)


def decode(space: Space, x: np.ndarray) -> dict[str, Any]:
    """Point in ``[0, 1]^D`` -> config (nearest category; constants copied)."""
    out = {k: v for k, v in space.items() if k not in _numeric(space)}
    for k, u in zip(_numeric(space), np.clip(x, 0.0, 1.0)):
        d = space[k]
        if isinstance(d, (Grid, Choice)):
            out[k] = d.values[int(round(float(u) * (len(d.values) - 1)))]
        elif isinstance(d, Uniform):
            out[k] = d.low + float(u) * (d.high - d.low)
        else:
            out[k] = math.exp(math.log(d.low) + float(u) * (math.log(d.high) - math.log(d.low)))
    return {k: out[k] for k in space}
