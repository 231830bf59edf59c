"""Invariants every registered system keeps (``gpu.systems.SYSTEMS``, found by scanning ``gpu.schedulers``): a new
system's package is tested by adding it, nothing else."""

import ast
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu.errors import ConfigError
from gpu.contract import contract_violations
from gpu.systems import BATCH_POLICIES, ROOT, SYSTEMS, make_batch_policy, resolve, system
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


# Flows that run no system, each documented in flows/__init__.py's docstring.
NON_SYSTEM_FLOWS = {"flows.pool_demo", "flows.demo"}


def test_every_system_follows_the_one_layout(entry):
    """Same modules, same names, in every system: what ``docs/architecture.md`` ("Adding a ninth system") lists."""
    package = ROOT / "gpu" / "schedulers" / entry.name
    assert {"__init__.py", "system.py", "controller.py", "policies.py"} <= {p.name for p in package.iterdir()}
    assert (ROOT / "gpu" / "sim" / entry.name / "run.py").is_file()
    assert entry.controller.startswith(f"gpu.schedulers.{entry.name}.controller:")
    assert entry.policies == f"gpu.schedulers.{entry.name}.policies:POLICIES"
    assert entry.example_path().is_file() and entry.example.startswith(f"scenarios/{entry.name}/")
    assert entry.flows, "every system runs in production through at least one flow"
    assert (ROOT / "docs" / f"{entry.name}.md").is_file()


def test_every_flow_is_named_by_a_system_and_every_named_flow_exists():
    modules = {f"flows.{p.stem}" for p in (ROOT / "flows").glob("*.py") if p.stem != "__init__"}
    named = {flow for entry in SYSTEMS.values() for flow in entry.flows}
    assert named <= modules, f"registered flows with no module: {sorted(named - modules)}"
    assert modules - named == NON_SYSTEM_FLOWS, "a flow runs a system no entry names, or a non-system flow is new"
    doc = ast.get_docstring(ast.parse((ROOT / "flows" / "__init__.py").read_text()))
    assert all(f"``{m.split('.')[1]}``" in doc for m in NON_SYSTEM_FLOWS)
    deployed = {"flows." + Path(d["entrypoint"].split(":")[0]).stem
                for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    assert deployed <= modules and named <= deployed, "every system's flows are deployed by prefect.yaml"


def test_batch_policies_come_from_the_systems_that_declare_them():
    """The serving batch policies are the systems' (Nexus §6.3, ORLOJ §4.5), found by name, built fresh per call."""
    declared = {name: ref for entry in SYSTEMS.values() for name, ref in entry.batch_policies.items()}
    assert BATCH_POLICIES == declared and {"early_drop", "orloj"} <= set(BATCH_POLICIES)
    for name, ref in BATCH_POLICIES.items():
        owner = next(e.name for e in SYSTEMS.values() if name in e.batch_policies)
        assert ref.startswith(f"gpu.schedulers.{owner}."), (name, ref)
    assert make_batch_policy("clipper") is not make_batch_policy("clipper")  # each worker owns its policy's state


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return ({a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module})


def test_the_core_names_no_system_and_systems_import_each_other_nowhere():
    """``gpu/*.py`` imports no system package (the registry finds them); a system package imports no other."""
    core = {p.name: _imports(p) for p in (ROOT / "gpu").glob("*.py")}
    assert {name: sorted(m for m in mods if m.startswith(("gpu.schedulers.", "gpu.sim.")))
            for name, mods in core.items()} == {name: [] for name in core}
    for name in SYSTEMS:
        for path in (ROOT / "gpu" / "schedulers" / name).rglob("*.py"):
            others = {m.split(".")[2] for m in _imports(path) if m.startswith("gpu.schedulers.")} - {name}
            assert not others, f"{path.relative_to(ROOT)} imports the systems {sorted(others)}"


def test_reading_the_registry_imports_no_engine():
    """``gpuflows --help`` and the block read the registry: that must import each system's entry and nothing else."""
    code = ("import sys, gpu.systems; "
            "print(sorted(m for m in sys.modules if m.startswith(('gpu.schedulers.', 'gpu.sim'))"
            " and m.count('.') > 2 and not m.endswith('.system')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


SYSTEM_PY = '''from gpu.plugin import System

SYSTEM = System(name="{name}", paper="a ninth paper", controller="gpu.schedulers.{name}.controller:Ninth",
                example="scenarios/{name}/small.yaml", flows=("flows.ninth",), batch_policies={{"ninth_batch": "x:y"}})
'''


def test_a_new_system_package_is_found_without_editing_a_shared_module(tmp_path, monkeypatch):
    """A ninth package under ``gpu.schedulers`` with its ``system.py`` is in the registry; one without is refused."""
    import gpu.schedulers
    from gpu.systems import _batch_policies, discover

    (tmp_path / "ninth").mkdir()
    (tmp_path / "ninth" / "__init__.py").write_text('"""A ninth system."""\n')
    (tmp_path / "ninth" / "system.py").write_text(SYSTEM_PY.format(name="ninth"))
    monkeypatch.setattr(gpu.schedulers, "__path__", [*gpu.schedulers.__path__, str(tmp_path)])
    try:
        found = discover()
        assert set(found) == set(SYSTEMS) | {"ninth"} and found["ninth"].flows == ("flows.ninth",)
        assert found["ninth"].policies == "gpu.schedulers.ninth.policies:POLICIES"
        assert _batch_policies(found)["ninth_batch"] == "x:y"

        (tmp_path / "tenth").mkdir()
        (tmp_path / "tenth" / "__init__.py").write_text('"""A system that forgot its entry."""\n')
        importlib.invalidate_caches()
        with pytest.raises(ImportError, match=r"gpu\.schedulers\.tenth .*system\.py"):
            discover()
    finally:  # the toy packages leave with the test
        for module in [m for m in sys.modules if m.startswith(("gpu.schedulers.ninth", "gpu.schedulers.tenth"))]:
            del sys.modules[module]
