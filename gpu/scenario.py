"""Loading scenario files (JSON or YAML) and validating their fields with errors that name them.

Every system's simulator reads its scenario through these helpers, so the format rules
(file types, error wording) are the same everywhere.
"""

from __future__ import annotations

import functools
import json
import math
import re
from itertools import accumulate
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from gpu.errors import ConfigError, excerpt


MAX_DEPTH = 32  # nesting levels of a scenario; real ones use < 8, and the parsers recurse per level
MAX_VALUES = 1_000_000  # values a YAML scenario may stand for once its aliases are expanded

# Upper bounds of the numbers scenario files and flow arguments give, named once so every system bounds a
# quantity alike (each format's docs state its fields' bounds): far beyond any real setup and the papers', and
# short of the values that make a run hang, fill memory or print nonsense (1e30 requests/s, an SLO of 1e308 ms).
MAX_SECONDS = 30 * 24 * 3600.0  # a month: durations, horizons, arrival, iteration, run and poll times, timeouts
MAX_MS = 3_600_000.0            # an hour in ms: latencies, SLOs, per-request and per-batch times
MAX_RATE = 1_000_000.0          # requests, queries or arrivals per second
MAX_MB = 1024.0 ** 2            # 1 TiB in MB: a job's, a model's or a device's memory (as gpu.devices bounds devices)
MAX_FACTOR = 1_000_000.0        # weights, demands in units of a resource, gains, multipliers
MAX_COUNT = 1_000_000           # counts: jobs, iterations, trials, steps, batch sizes, CPUs, words
MAX_EVENTS = 10_000_000         # events one simulated run may generate (requests = rate x duration, polls, ...)
MAX_GPUS = 100_000              # GPUs of a simulated cluster or pool (executors keep per-GPU state)
MAX_BATCH = 4_096               # requests in one batch: far beyond the 64-128 the papers profile; per-batch tables
MAX_FANOUT = 1_000.0            # requests one query stage issues to the next per request (a DAG's gamma)
MAX_SEED = 2**32 - 1            # numpy's legacy seed range: every seed any of our generators takes
MAX_SEEDS = 100                 # seeds one scenario averages over (each is a whole run)


def load_scenario(path: str | Path) -> dict[str, Any]:
    """Read a JSON (``.json``) or YAML (``.yaml``/``.yml``) scenario into a dict.

    Refused with a ConfigError naming the file: nesting deeper than MAX_DEPTH (the parsers would die of a
    RecursionError), a key given twice in one mapping (the last one silently won), YAML aliases that refer to
    themselves or expand to more than MAX_VALUES values (a "billion laughs" document of 1.6 KB).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("scenario", str(p), "no such file")
    suffix = p.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ConfigError("scenario", str(p), "expected a .json, .yaml or .yml file")
    import yaml

    try:
        text = p.read_text(encoding="utf-8")
        data = _load_json(text, str(p)) if suffix == ".json" else _load_yaml(text, str(p))
    except ConfigError:
        raise
    except (ValueError, yaml.YAMLError) as exc:  # ValueError: bad UTF-8, bad JSON, an int of > 4,300 digits
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError("scenario", str(p), f"not valid {'JSON' if suffix == '.json' else 'YAML'}: {first}") from exc
    if not isinstance(data, dict):
        raise ConfigError("scenario", str(p), "the top level must be a mapping")
    return data


def _load_json(text: str, source: str) -> Any:
    """``json.loads`` after measuring the nesting (brackets outside strings), refusing duplicate keys."""
    brackets = re.sub(r"[^\[\]{}]", "", re.sub(r'"(?:[^"\\]|\\.)*"', "", text))
    if max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0) > MAX_DEPTH:
        raise ConfigError("scenario", source, f"nested deeper than {MAX_DEPTH} levels")

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError("scenario", source, f"key {excerpt(key)} given twice in one mapping")
            out[key] = value
        return out

    return json.loads(text, object_pairs_hook=unique)


def _load_yaml(text: str, source: str) -> Any:
    loader = _strict_loader()(text, source)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@functools.cache
def _strict_loader() -> type:
    """PyYAML's safe loader, measuring every node as it is composed (aliases are composed once and shared, so
    this is linear in the file even when the data it stands for is not)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def __init__(self, text: str, source: str):
            super().__init__(text)
            self.source, self.level = source, 0
            self.shape: dict[int, tuple[int, int]] = {}  # id(node) -> (depth, values once aliases are expanded)

        def refuse(self, mark: Any, why: str) -> None:
            raise ConfigError("scenario", self.source, f"line {mark.line + 1}: {why}")

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                node = self.anchors.get(event.anchor)
                if node is not None and id(node) not in self.shape:
                    self.refuse(event.start_mark, f"alias *{event.anchor} is inside its own anchor")
                return super().compose_node(parent, index)
            self.level += 1
            if self.level > MAX_DEPTH + 1:  # + 1: the scalars inside the deepest collections
                self.refuse(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
            node = super().compose_node(parent, index)
            self.level -= 1
            if isinstance(node, yaml.ScalarNode):
                depth, values = 0, 1
            else:
                children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
                shapes = [self.shape[id(c)] for c in children]
                depth, values = 1 + max((d for d, _ in shapes), default=0), 1 + sum(v for _, v in shapes)
            if depth > MAX_DEPTH:
                self.refuse(node.start_mark, f"nested deeper than {MAX_DEPTH} levels")
            if values > MAX_VALUES:
                self.refuse(node.start_mark, f"its aliases expand to more than {MAX_VALUES:,} values")
            self.shape[id(node)] = (depth, values)
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # ``<<: *base`` entries may be overridden
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in seen:
                        self.refuse(key_node.start_mark, f"key {excerpt(key)} given twice in one mapping")
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    break
            return super().construct_mapping(node, deep)

    return StrictLoader


def require(mapping: Mapping[str, Any], key: str, where: str = "") -> Any:
    """Return ``mapping[key]`` or raise a ConfigError naming the missing field."""
    if key not in mapping:
        raise ConfigError(f"{where}{key}", None, "is required")
    return mapping[key]


def number(value: Any, field: str, *, upper: float | None = None) -> float:
    """Check that ``value`` is a finite number (not a bool, a string or NaN/inf), at most ``upper`` if given, and
    return it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a number")
    try:
        v = float(value)
    except OverflowError:  # an int beyond any float
        raise ConfigError(field, value, "must be a finite number") from None
    if not math.isfinite(v):
        raise ConfigError(field, value, "must be a finite number")
    if upper is not None and v > upper:
        raise ConfigError(field, value, f"must be <= {upper:,.12g}")
    return v


def positive(value: Any, field: str, *, allow_zero: bool = False, upper: float | None = None) -> float:
    """Check that ``value`` is a finite number > 0 (or >= 0), at most ``upper`` if given, and return it as float."""
    v = number(value, field)
    if v < 0 or (v == 0 and not allow_zero):
        raise ConfigError(field, value, "must be >= 0" if allow_zero else "must be > 0")
    if upper is not None and v > upper:
        raise ConfigError(field, value, f"must be <= {upper:,.12g}")
    return v


def integer(value: Any, field: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """Check that ``value`` is a whole number (``3`` or ``3.0``, not ``3.5``, ``"3"`` or a bool) from ``minimum`` to
    ``maximum`` (each if given), and return it as int."""
    v = number(value, field)
    if not v.is_integer():
        raise ConfigError(field, value, "must be a whole number")
    if minimum is not None and v < minimum:
        raise ConfigError(field, value, f"must be >= {minimum}")
    if maximum is not None and v > maximum:
        raise ConfigError(field, value, f"must be <= {maximum:,}")
    return int(v)


def within_events(count: float, field: str, value: Any, what: str) -> None:
    """Refuse a simulated run of more than MAX_EVENTS events, ``count`` estimated from its fields (``what`` says
    how, e.g. "requests (rate x duration)"); named after the field that makes it so."""
    if count > MAX_EVENTS:
        raise ConfigError(field, value, f"the run would simulate about {count:,.0f} {what}; at most {MAX_EVENTS:,}")


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
    """An id or a name as text (YAML reads ``id: 1`` as a number, which is fine; a list, null or blank is not:
    an empty id cannot be told apart in the plan, the tables or the logs)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(field, value, "must be a name (text)")
    if not str(value).strip():
        raise ConfigError(field, value, "must not be empty")
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
