"""Loading scenario files (JSON or YAML) and validating their fields with errors that name them.

Every system's simulator reads its scenario through these helpers, so the format rules
(file types, error wording) are the same everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from gpu.errors import ConfigError


def load_scenario(path: str | Path) -> dict[str, Any]:
    """Read a JSON (``.json``) or YAML (``.yaml``/``.yml``) scenario into a dict."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("scenario", str(p), "no such file")
    text = p.read_text()
    if p.suffix.lower() in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    elif p.suffix.lower() == ".json":
        data = json.loads(text)
    else:
        raise ConfigError("scenario", str(p), "expected a .json, .yaml or .yml file")
    if not isinstance(data, dict):
        raise ConfigError("scenario", str(p), "the top level must be a mapping")
    return data


def require(mapping: Mapping[str, Any], key: str, where: str = "") -> Any:
    """Return ``mapping[key]`` or raise a ConfigError naming the missing field."""
    if key not in mapping:
        raise ConfigError(f"{where}{key}", None, "is required")
    return mapping[key]


def positive(value: Any, field: str, *, allow_zero: bool = False) -> float:
    """Check that ``value`` is a number > 0 (or >= 0) and return it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a number")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(field, value, "must be >= 0" if allow_zero else "must be > 0")
    return float(value)


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
