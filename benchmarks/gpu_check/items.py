"""The checks, in the order they run, with what each one is given: its budget and the settings of the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

QUICK_TOTAL_S = 175.0  # --quick ends within 3 minutes: each check gets at most what is left of this


@dataclass(frozen=True)
class Settings:
    """What a check is told: ``quick`` (smaller runs), and ``workdir``, a fresh folder of its own."""

    quick: bool
    workdir: Path


@dataclass(frozen=True)
class Item:
    """One check: ``module`` holds its ``check(settings) -> Outcome``; ``quick_s``/``full_s`` its budget in seconds
    (its subprocess is killed after that and the check FAILs); ``prefect``: it runs Prefect flows."""

    number: str
    name: str
    title: str
    module: str
    quick_s: float
    full_s: float
    prefect: bool = False

    def budget(self, quick: bool, scale: float = 1.0) -> float:
        return scale * (self.quick_s if quick else self.full_s)


ITEMS: tuple[Item, ...] = (  # the two quick in-process checks first: under --quick's total they always get to run
    Item("1", "devices", "NVML and torch agree on devices, memory and UUIDs; `gpuflows devices` lists them",
         "benchmarks.gpu_check.devices", 20, 30),
    Item("6", "batching", "l(b) of real torch models at b = 1..64: batching gain, share of the device's limit",
         "benchmarks.gpu_check.batching", 20, 40),
    Item("2", "pool", "GpuTaskRunner (process) on real devices: shared slices, memory cap, whole devices",
         "benchmarks.gpu_check.pool", 45, 80, prefect=True),
    Item("3", "mps", "MPS active-thread percentage and kernel throughput follow the slice",
         "benchmarks.gpu_check.mps", 35, 60, prefect=True),
    Item("4", "salus", "Salus executor: two torch jobs in lanes, switch cost, memory, SRTF vs FIFO",
         "benchmarks.gpu_check.salus", 45, 90, prefect=True),
    Item("5a", "ekya", "Ekya one window on CUDA: measured retraining time vs the micro-profiler's prediction",
         "benchmarks.gpu_check.ekya", 50, 110, prefect=True),
    Item("5b", "fluid", "FLUID one TrialGroup on CUDA: packing curve c on the device, trial time vs prediction",
         "benchmarks.gpu_check.fluid", 45, 110, prefect=True),
    Item("7", "tracking", "NVML utilisation and memory per task in MLflow",
         "benchmarks.gpu_check.tracking", 30, 50, prefect=True),
)  # full budgets add up to 9.5 minutes: a whole run fits one 10-minute command on a lent GPU machine
BY_NAME = {item.name: item for item in ITEMS}
