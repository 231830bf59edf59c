"""The device-free parts of ``python -m benchmarks.gpu_check``: the command without a GPU, its line and JSON format,
the placement arithmetic and the memory-cap arithmetic its checks are held to, and what it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check.cli import main
from benchmarks.gpu_check.items import ITEMS
from benchmarks.gpu_check.pool import names_cap, plan, torch_size
from benchmarks.gpu_check.report import WIDTH, Outcome, flat_json
from gpu.devices import parse_simulated

ROOT = Path(__file__).resolve().parents[1]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="the command runs every check where CUDA is available")
def test_without_a_gpu_every_check_skips_in_one_run_and_the_json_has_every_key(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert main(["--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sum("no CUDA device here" in line for line in printed) == 1
    lines = [line for line in printed if line.startswith("[")]
    assert [line.split()[0] for line in lines] == ["[SKIP]"] * len(ITEMS)
    data = json.loads(out.read_text())
    assert data["cuda"] is False and data["skipped"] == len(ITEMS) and data["failed"] == 0
    for item in ITEMS:
        assert data[f"{item.name}_status"] == "SKIP" and data[f"{item.name}_detail"]


def test_only_runs_the_named_checks(tmp_path, capsys):
    if _cuda():
        pytest.skip("the command runs the named check where CUDA is available")
    assert main(["--only", "pool", "--only", "batching"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line.split()[2] for line in lines] == ["batching", "pool"]  # in the command's order, not the flags'


def test_every_line_fits_120_columns_and_the_json_round_trips():
    long = Outcome("fluid", "FAIL", "c=3 alpha=1.21 " * 12, "trial time off: " + "c0001@0 9.1, " * 20,
                   {"c": 3, "alpha": float("nan"), "gains": (1.0, 1.8)}, seconds=12.4)
    assert len(long.line("5b")) <= WIDTH and long.line("5b").startswith("[FAIL] 5b fluid")
    data = long.to_json()
    assert data["fluid_alpha"] is None and data["fluid_gains"] == [1.0, 1.8]
    assert Outcome.from_json("fluid", json.loads(json.dumps(data))) == Outcome(
        "fluid", "FAIL", long.figure, long.detail, {"c": 3, "alpha": None, "gains": [1.0, 1.8]}, 12.4)
    both = flat_json([long, Outcome("mps", "SKIP", detail="no MPS daemon")], cuda=True)
    assert (both["failed"], both["skipped"], both["mps_status"]) == (1, 1, "SKIP")
    with pytest.raises(ValueError):
        Outcome("x", "WARN")


def test_the_ledger_plans_four_quarters_on_one_device_and_whole_gpus_apart_or_queued():
    one = plan(parse_simulated("1x80GiB").devices)
    assert one.quarter_devices == (0, 0, 0, 0) and one.whole_devices == (0,) and one.whole_queue
    two = plan(parse_simulated("2x80GiB").devices)
    assert len(set(two.quarter_devices)) == 1 and sorted(two.whole_devices) == [0, 1] and not two.whole_queue


def test_the_cap_is_recognised_as_torch_names_it_in_its_out_of_memory_error():
    cap = 2 * 2**30
    assert (torch_size(1000), torch_size(1536), torch_size(512 * 2**20), torch_size(cap)) == (
        "1000 bytes", "1.50 KiB", "512.00 MiB", "2.00 GiB")
    message = ("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.65 GiB of which "
               "75.1 GiB is free. 2.00 GiB allowed; Of the allocated memory 0 bytes is allocated by PyTorch")
    assert names_cap(message, cap)
    assert not names_cap(message.replace("2.00 GiB allowed; ", ""), cap)  # an OOM with no cap set
    assert not names_cap(message, 3 * 2**30)  # another cap
    assert not names_cap("RuntimeError: 2.00 GiB allowed", cap)  # not an out-of-memory error


def test_nothing_it_imports_pulls_mlflow_or_ray_and_it_runs_without_them():
    modules = ["benchmarks.gpu_check.cli", *sorted({item.module for item in ITEMS}), "benchmarks.gpu_check.work"]
    script = (
        "import sys\n"
        f"for name in {modules!r}: __import__(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'ray'))\n"
        "assert not loaded, loaded\n"
        "sys.modules['mlflow'] = sys.modules['ray'] = None\n"  # as on the GPU machine: importing either fails
        "import torch\n"
        "from benchmarks.gpu_check.cli import main\n"
        "sys.exit(0 if torch.cuda.is_available() else main(['--quick']))\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
