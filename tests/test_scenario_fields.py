"""Scenario files and fields: every bad value is one ConfigError naming it, never a parser's traceback."""

import math
import re

import pytest

from gpu.errors import ConfigError, excerpt
from gpu.scenario import flag, integer, load_scenario, mapping, names, number, positive


@pytest.mark.parametrize("name,text,why", [
    ("s.yaml", "gpus: [1\n", "not valid YAML"),
    ("s.json", '{"gpus": 1,}', "not valid JSON"),
    ("s.yaml", "- a\n- b\n", "the top level must be a mapping"),
    ("dup.yaml", "gpus: 2\nwindow_s: 10\ngpus: 4\n", "line 3: key 'gpus' given twice in one mapping"),
    ("dup.yaml", "streams:\n  - {name: a, name: b}\n", "line 2: key 'name' given twice in one mapping"),
    ("dup.json", '{"gpus": 2, "gpus": 4}', "key 'gpus' given twice in one mapping"),
])
def test_a_broken_scenario_file_is_one_error_naming_the_file(tmp_path, name, text, why):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"scenario={re.escape(excerpt(str(path)))}: {why}"):
        load_scenario(path)


def test_a_scenario_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"gpus: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_scenario(path)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_not_numbers_of_a_scenario(value):
    with pytest.raises(ConfigError, match=r"gpus=.*must be a finite number"):
        positive(value, "gpus")
    with pytest.raises(ConfigError, match="finite"):
        number(value, "x")


@pytest.mark.parametrize("value,ok", [(3, 3), (3.0, 3), (3.5, None), ("3", None), (True, None), (0, None)])
def test_integer_fields_take_whole_numbers_only(value, ok):
    if ok is None:
        with pytest.raises(ConfigError, match=r"n="):
            integer(value, "n", minimum=1)
    else:
        assert integer(value, "n", minimum=1) == ok


def test_sections_flags_and_name_lists_are_checked_for_their_type():
    assert mapping(None, "fluid") == {} and mapping({"c": 2}, "fluid") == {"c": 2}
    with pytest.raises(ConfigError, match=r"fluid=\[1, 2\]: must be a mapping"):
        mapping([1, 2], "fluid")
    assert flag(False, "noise") is False
    with pytest.raises(ConfigError, match=r"noise='false': must be true or false"):
        flag("false", "noise")
    assert names(["fifo", "fluid"], "policies") == ["fifo", "fluid"]
    with pytest.raises(ConfigError, match=r"policies='fifo': must be a list"):
        names("fifo", "policies")
