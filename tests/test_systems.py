"""Invariants every registered system keeps (``gpu.systems.SYSTEMS``): a new system's entry is tested
by adding it, nothing else."""

import json
import math

import pytest

from gpu.errors import ConfigError
from gpu.contract import contract_violations
from gpu.systems import SYSTEMS, resolve, system
from resource_blocks import SchedulerPolicy


OWN_COMPUTE_TIME = {"decision_ms", "decision_to_round_ratio"}  # how long our code took to decide: measured, so not reproducible


def _figures(report) -> str:
    def strip(rows):
        return [{k: v for k, v in row.items() if k not in OWN_COMPUTE_TIME} for row in rows]

    d = report.to_dict()
    d["table"] = strip(d["table"])
    d["extra_tables"] = {k: strip(v) for k, v in d["extra_tables"].items()}
    d["summary"] = {k: v for k, v in d["summary"].items() if not any(t in k for t in OWN_COMPUTE_TIME)}
    return json.dumps(d, default=float)


@pytest.fixture(params=sorted(SYSTEMS))
def entry(request):
    return SYSTEMS[request.param]


def test_the_example_runs_every_default_policy_reproducibly(entry):
    first = entry.run(str(entry.example_path()), None)
    again = entry.run(str(entry.example_path()), None)
    assert first.system == entry.name and first.table
    assert _figures(first) == _figures(again), "seeded: same scenario, same figures"
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in first.summary.values())
    listed = entry.policy_names()
    for row in first.table:
        if "policy" in row:
            entry.check_policy(str(row["policy"]))  # the report names only policies the system offers
    assert listed and len(set(listed)) == len(listed)


def test_the_controller_follows_the_contract(entry):
    """The one decision loop the simulator and the flow both drive (``gpu.contract``)."""
    controller = resolve(entry.controller)
    assert contract_violations(controller) == []
    assert controller.system == entry.name


def test_a_bad_policy_is_refused_before_simulating(entry):
    with pytest.raises(ConfigError) as err:
        entry.run(str(entry.example_path()), ["no-such-policy"])
    assert err.value.field == "policy" and "no-such-policy" in str(err.value)


def test_the_policy_block_takes_exactly_the_registered_policies(entry):
    for name in entry.policy_names():
        concrete = name.replace("<", "x").replace(">", "")
        assert SchedulerPolicy(system=entry.name, policy=concrete).policy == concrete
    with pytest.raises(ValueError, match="no-such-policy"):
        SchedulerPolicy(system=entry.name, policy="no-such-policy")


def test_unknown_system_names_the_choices():
    with pytest.raises(ConfigError, match="choose from"):
        system("salsa")
