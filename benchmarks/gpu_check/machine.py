"""What this machine offers the checks: a CUDA device torch can use, and what NVML and the driver say.

Probed without starting CUDA in the calling process beyond ``torch.cuda.is_available()``: the checks run in
subprocesses of their own, each starting its own CUDA context.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    """``cuda``: torch can use a CUDA device here; ``why``: one line saying why not (when not)."""

    cuda: bool
    why: str
    torch: str
    cuda_build: str
    nvml: tuple[str, ...]  # NVML's device names, one per GPU
    driver: str

    def describe(self) -> str:
        gpus = f"{len(self.nvml)} x {self.nvml[0]}" if self.nvml else "no NVML device"
        return (f"torch {self.torch} (CUDA build {self.cuda_build or 'none'}), driver {self.driver or '-'}, {gpus}")

    def facts(self) -> dict[str, object]:
        """The machine as flat JSON keys."""
        return {"cuda": self.cuda, "torch": self.torch, "torch_cuda_build": self.cuda_build,
                "driver": self.driver, "gpus": len(self.nvml), "device": self.nvml[0] if self.nvml else ""}


def _driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError: no library, no driver, no device
        return ""
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    finally:
        pynvml.nvmlShutdown()


def probe() -> Machine:
    """torch's and NVML's view of this machine."""
    from gpu.devices import nvml_devices

    nvml = tuple(d.name for d in nvml_devices())
    driver = _driver()
    if importlib.util.find_spec("torch") is None:
        return Machine(False, "torch is not installed", "-", "", nvml, driver)
    import torch

    build = torch.version.cuda or ""
    if build and torch.cuda.is_available():
        return Machine(True, "", torch.__version__, build, nvml, driver)
    why = f"torch {torch.__version__} {'sees no CUDA device' if build else 'is a CPU build'}"
    return Machine(False, f"{why}; NVML {f'lists {len(nvml)} GPU(s)' if nvml else 'finds no GPU'}", torch.__version__,
                   build, nvml, driver)
