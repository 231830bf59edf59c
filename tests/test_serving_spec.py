"""The serving spec loader (tasks/serving/spec.py): every bad field is one ConfigError naming it and its value.

No Prefect server: these parse the shipped spec with one field changed, as ``flows/serving_rollout.py`` does."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from gpu.errors import ConfigError
from tasks.serving.spec import load_spec, parse_spec

DIGITS = Path(__file__).resolve().parents[1] / "scenarios" / "serving" / "digits.yaml"
SHIPPED = yaml.safe_load(DIGITS.read_text())


def edited(path: tuple, value) -> dict:
    """The shipped spec with the field at ``path`` (keys and list indices) set to ``value``."""
    raw = copy.deepcopy(SHIPPED)
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


@pytest.mark.parametrize("path,value,message", [
    (("queries", 0, "stages", 1, "gamma"), "two", r"queries\[0\]\.stages\[1\]\.gamma='two': must be a number"),
    (("queries", 0, "rate"), "40", r"queries\[0\]\.rate='40': must be a number"),
    (("queries", 0, "slo_ms"), float("inf"), r"queries\[0\]\.slo_ms=inf: must be a finite number"),
    (("queries", 0, "stages"), "detect", r"queries\[0\]\.stages='detect': must be a list"),
    (("queries", 0, "stages", 0, "model"), ["digits_cnn"], r"queries\[0\]\.stages\[0\]\.model=\['digits_cnn'\]"),
    (("queries", 0, "streams"), 2, r"queries\[0\]\.streams=2: unknown field"),
    (("sessions",), "mlp", r"sessions='mlp': must be a list"),
    (("sessions", 0), 5, r"sessions\[0\]=5: must be a mapping"),
    (("sessions", 0, "slo_ms"), "10", r"sessions\[0\]\.slo_ms='10': must be a number"),
    (("sessions", 0, "rate"), float("nan"), r"sessions\[0\]\.rate=nan: must be a finite number"),
    (("sessions", 0, "id"), None, r"sessions\[0\]\.id=None: must be a name"),
    (("trace",), [1], r"trace=\[1\]: must be a mapping"),
    (("trace", "duration_s"), float("nan"), r"trace\.duration_s=nan: must be a finite number"),
    (("trace", "duration_s"), "30", r"trace\.duration_s='30': must be a number"),
    (("trace", "seed"), 1.5, r"trace\.seed=1\.5: must be a whole number"),
    (("trace", "phases"), "ab", r"trace\.phases='ab': must be a list"),
    (("trace", "phases", 1), 10, r"trace\.phases\[1\]=10: must be a mapping"),
    (("trace", "phases", 1, "rates"), [1], r"trace\.phases\[1\]\.rates=\[1\]: must be a mapping"),
    (("trace", "phases", 1, "rates"), {"mlp": "5"}, r"trace\.phases\[1\]\.rates\.mlp='5': must be a number"),
    (("trace", "phases", 2, "at_s"), 5, r"trace\.phases\[2\]\.at_s=5: must be after the previous phase's 10 s"),
    (("trace", "phases", 1, "at_s"), float("inf"), r"trace\.phases\[1\]\.at_s=inf"),
    (("runtime",), "fast", r"runtime='fast': must be a mapping"),
    (("runtime", "training_steps"), 0.5, r"runtime\.training_steps=0\.5: must be a whole number"),
    (("runtime", "training_steps"), 0, r"runtime\.training_steps=0: must be >= 1"),
    (("runtime", "profile_repeats"), "10", r"runtime\.profile_repeats='10': must be a number"),
    (("runtime", "seed"), 3, r"runtime\.seed=3: unknown field"),  # the trace's seed is the run's
    (("epoch",), "fast", r"epoch='fast': must be a mapping"),
    (("epoch", "epoch_s"), "10", r"epoch\.epoch_s='10': must be a number"),
    (("epoch", "beacon_s"), float("nan"), r"epoch\.beacon_s=nan: must be a finite number"),
    (("epoch", "min_epoch_s"), 20, r"epoch\.min_epoch_s=20: must be <= epoch_s=10"),
    (("epoch", "epoc_s"), 10, r"epoch\.epoc_s=10: unknown field"),
])
def test_a_mistyped_spec_field_is_one_config_error_naming_it(path, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_spec(edited(path, value))


def test_a_spec_file_is_read_through_the_same_checks(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(edited(("trace", "duration_s"), float("nan"))))
    with pytest.raises(ConfigError, match=r"trace\.duration_s=nan"):
        load_spec(str(p))


def test_the_shipped_spec_keeps_its_values():
    spec = load_spec(str(DIGITS))
    assert (spec.duration_s, spec.seed, spec.training_steps, spec.profile_repeats) == (30.0, 0, 150, 10)
    assert [p["at_s"] for p in spec.phases] == [0.0, 10.0, 20.0] and spec.epoch.epoch_s == 10.0
    assert spec.chains() == {"pipeline/classify": ("pipeline/detect", 2.0)}
