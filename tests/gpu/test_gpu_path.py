"""The GPU path on a CUDA device: each of ``python -m benchmarks.gpu_check``'s checks as a test (marker ``gpu``).

They call the same check functions the command runs (``benchmarks.gpu_check.<check>.check``) and hold them to the
same verdict: PASS. Without CUDA every one skips; a check that cannot run here (no MPS daemon, no mlflow) skips
saying why. Run them with ``pytest -m gpu tests/gpu`` on a GPU machine; each starts its own flows and workers.
"""

from __future__ import annotations

import importlib

import pytest

from benchmarks.gpu_check.items import ITEMS, Settings


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="no CUDA device")]


@pytest.mark.parametrize("item", ITEMS, ids=[item.name for item in ITEMS])
def test_check_passes_on_the_device(item, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    outcome = importlib.import_module(item.module).check(Settings(quick=True, workdir=tmp_path))
    if outcome.status == "SKIP":
        pytest.skip(f"{item.name}: {outcome.detail}")
    assert outcome.status == "PASS", f"{item.name}: {outcome.detail} ({outcome.figure})"
