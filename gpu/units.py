"""Memory sizes as users write them ("16GiB", "512MB", 2**30) converted to bytes."""

from __future__ import annotations

import math
import re

from gpu.errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_MAX_BYTES = 2**62  # far beyond any device, and within the ledger's SQLite integers


def parse_memory(value: int | float | str | None, field: str = "memory") -> int:
    """Bytes from an int (bytes) or a string with a unit; None means 0."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ConfigError(field, value, "expected bytes or a size such as '4GiB'")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(field, value, "must be a finite number of bytes >= 0")
        nbytes = value
    else:
        m = _PATTERN.match(str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(field, value, "expected bytes or a size such as '4GiB', '512MiB', '2GB'")
        nbytes = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if nbytes > _MAX_BYTES:
        raise ConfigError(field, value, f"larger than any device ({format_memory(_MAX_BYTES)} at most)")
    return int(nbytes)


def format_memory(nbytes: int) -> str:
    """Short human form, e.g. 17179869184 -> '16GiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes}B"
