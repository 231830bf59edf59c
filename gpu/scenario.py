"""Loading scenario files (JSON or YAML) and validating their fields with errors that name them.

Every system's simulator reads its scenario through these helpers, so the format rules
(file types, error wording) are the same everywhere.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from gpu.errors import ConfigError


def load_scenario(path: str | Path) -> dict[str, Any]:
    """Read a JSON (``.json``) or YAML (``.yaml``/``.yml``) scenario into a dict."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("scenario", str(p), "no such file")
    suffix = p.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ConfigError("scenario", str(p), "expected a .json, .yaml or .yml file")
    import yaml

    try:
        text = p.read_text(encoding="utf-8")
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError("scenario", str(p), f"not valid {'JSON' if suffix == '.json' else 'YAML'}: {first}") from exc
    if not isinstance(data, dict):
        raise ConfigError("scenario", str(p), "the top level must be a mapping")
    return data


def require(mapping: Mapping[str, Any], key: str, where: str = "") -> Any:
    """Return ``mapping[key]`` or raise a ConfigError naming the missing field."""
    if key not in mapping:
        raise ConfigError(f"{where}{key}", None, "is required")
    return mapping[key]


def number(value: Any, field: str) -> float:
    """Check that ``value`` is a finite number (not a bool, a string or NaN/inf) and return it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a number")
    if not math.isfinite(value):
        raise ConfigError(field, value, "must be a finite number")
    return float(value)


def positive(value: Any, field: str, *, allow_zero: bool = False) -> float:
    """Check that ``value`` is a finite number > 0 (or >= 0) and return it as float."""
    v = number(value, field)
    if v < 0 or (v == 0 and not allow_zero):
        raise ConfigError(field, value, "must be >= 0" if allow_zero else "must be > 0")
    return v


def integer(value: Any, field: str, minimum: int | None = None) -> int:
    """Check that ``value`` is a whole number (``3`` or ``3.0``, not ``3.5``, ``"3"`` or a bool), at least
    ``minimum`` if given, and return it as int."""
    v = number(value, field)
    if not v.is_integer():
        raise ConfigError(field, value, "must be a whole number")
    if minimum is not None and v < minimum:
        raise ConfigError(field, value, f"must be >= {minimum}")
    return int(v)


def mapping(value: Any, field: str, *, optional: bool = True) -> dict[str, Any]:
    """Check that ``value`` is a mapping (a missing/None section is ``{}`` when ``optional``) and return a copy."""
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(field, value, "must be a mapping (key: value entries)")
    return dict(value)


def section(value: Any, field: str, allowed: Collection[str], *, optional: bool = True) -> dict[str, Any]:
    """A mapping (a section, a list entry) whose fields must all be ``allowed``: a misspelt field is an error,
    not silently ignored."""
    out = mapping(value, field, optional=optional)
    known_fields(out, allowed, f"{field}.")
    return out


def known_fields(fields: Mapping[str, Any], allowed: Collection[str], where: str = "") -> None:
    """Refuse keys the format does not have (``where``: the dotted prefix of their names, "" at the top level),
    so a misspelt field fails instead of silently leaving its default in place."""
    for key in fields:
        if key not in allowed:
            raise ConfigError(f"{where}{key}", fields[key], f"unknown field; expected one of {sorted(allowed)}")


def entries(value: Any, field: str, allowed: Collection[str]) -> list[dict[str, Any]]:
    """A list section (``sessions``, ``trace.phases``, ...) as its mappings (missing/None: empty), each with only
    ``allowed`` fields: a string or a mapping would otherwise be iterated as letters or keys."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(field, value, "must be a list of entries, e.g. [{...}, {...}]")
    return [section(e, f"{field}[{i}]", allowed, optional=False) for i, e in enumerate(value)]


def label(value: Any, field: str) -> str:
    """An id or a name as text (YAML reads ``id: 1`` as a number, which is fine; a list or null is not)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(field, value, "must be a name (text)")
    return str(value)


def flag(value: Any, field: str) -> bool:
    """Check that ``value`` is a boolean (``true``/``false``; the string ``'false'`` is not) and return it."""
    if not isinstance(value, bool):
        raise ConfigError(field, value, "must be true or false")
    return value


def names(value: Any, field: str) -> list[str]:
    """Check that ``value`` is a list of strings (a lone string is a mistake, not a list of letters)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(field, value, "must be a list of names, e.g. [a, b]")
    return list(value)


def fraction(value: Any, field: str) -> float:
    """Check that ``value`` is a number in [0, 1] and return it as float."""
    v = positive(value, field, allow_zero=True)
    if v > 1:
        raise ConfigError(field, value, "must be between 0 and 1")
    return v


def choose(value: Any, field: str, options: Mapping[str, Any] | list[str]) -> Any:
    """Check that ``value`` names one of ``options`` (e.g. a policy) and return the option's value."""
    if value not in options:
        raise ConfigError(field, value, f"unknown; choose one of {sorted(options)}")
    return options[value] if isinstance(options, Mapping) else value

def policy_names(raw: Mapping[str, Any], policies: list[str] | None, default: Sequence[str]) -> list[str]:
    """The CLI's policies, else the scenario's ``policies`` (a list: a lone string is not read letter by letter)."""
    if policies:
        return list(policies)
    if "policies" not in raw:
        return list(default)
    chosen = names(raw["policies"], "policies")
    if not chosen:
        raise ConfigError("policies", chosen, "must name at least one policy")
    return chosen
