"""The engine stays free of the heavy stacks, and the `gpuflows` command works without them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu.systems import SYSTEMS
from gpuflows.cli import main


def test_engine_imports_without_prefect_ray_mlflow_or_torch():
    code = ("import sys, gpu.ledger, gpu.pool, gpu.devices, gpu.placement, gpu.sim.events, gpu.report, gpu.scenario;"
            "import pkgutil, importlib, gpu, gpu.schedulers, gpu.sim;"
            "[importlib.import_module(m.name) for p in (gpu.schedulers, gpu.sim) "
            " for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')];"
            "bad = {'prefect', 'ray', 'mlflow', 'torch'} & {m.split('.')[0] for m in sys.modules};"
            "print(sorted(bad)); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_devices_and_pool_commands(state_dir, capsys):
    assert main(["devices", "--simulate", "2x8GiB"]) == 0
    assert "gpu1 Simulated GPU [simulated] 8GiB total" in capsys.readouterr().out
    from gpu.pool import open_pool

    open_pool("cli-test", simulated="2x8GiB").close()
    assert main(["pool", "--name", "cli-test"]) == 0
    out = capsys.readouterr().out
    assert "gpu0: compute 1.00 free" in out and "0 request(s) waiting" in out


def test_bad_input_is_one_clear_error(state_dir, capsys):
    assert main(["pool", "--name", "no/slashes"]) == 2
    assert "pool name='no/slashes'" in capsys.readouterr().err


def test_devices_lists_the_nvml_gpus_or_says_there_are_none(state_dir, capsys):
    from gpu.devices import discover

    assert main(["devices"]) == 0  # no NVIDIA driver: NVML finds nothing, which is not an error
    out = capsys.readouterr().out
    if discover(None).gpu_count:
        assert "gpu0" in out
    else:
        assert "no NVIDIA GPU visible through NVML" in out


def test_an_output_file_in_a_missing_folder_fails_before_the_work(state_dir, capsys, tmp_path):

    with pytest.raises(SystemExit) as exc:
        main(["simulate", "fluid", "scenarios/fluid/toy.yaml", "--json", str(tmp_path / "nope" / "out.json")])
    assert exc.value.code == 2
    err = capsys.readouterr()
    assert "argument --json" in err.err and "does not exist" in err.err and "makespan" not in err.out


def test_a_pool_name_with_no_saved_block_is_an_error_not_the_defaults(prefect_server):

    from gpu.errors import ConfigError
    from resource_blocks import GpuPool

    with pytest.raises(ConfigError, match="gpuflows-gpu-pool='no-such-pool': no saved block"):
        GpuPool.load_or_default("no-such-pool")
    assert GpuPool.load_or_default(None).name == "default"


def test_every_module_in_flows_is_a_flow_with_a_command_line(capsys):
    """The layout's promise: `python -m flows.<name> --help` for every module in flows/ (helpers live in tasks/)."""
    import importlib
    import pkgutil

    from prefect import Flow

    import flows

    for info in pkgutil.iter_modules(flows.__path__):
        module = importlib.import_module(f"flows.{info.name}")
        assert hasattr(module, "main"), f"flows.{info.name} has no main(argv)"
        if info.name != "demo":  # the demo runs the other flows
            assert any(isinstance(v, Flow) for v in vars(module).values()), f"flows.{info.name} defines no flow"
        with pytest.raises(SystemExit) as done:
            module.main(["--help"])
        assert done.value.code == 0 and "usage:" in capsys.readouterr().out, info.name


def test_help_says_what_each_command_takes(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = capsys.readouterr().out
    for name in SYSTEMS:  # every system's policies, with an example to copy
        assert f"gpuflows simulate {name} " in out
    assert "thief" in out and "static_fluid" in out
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "--streams" in capsys.readouterr().out  # the demo's own options, not the wrapper's
