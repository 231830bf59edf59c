"""Table A.1-like workloads and a seeded Tiresias-like job trace for the Salus simulator (thesis §2.5, App. A.1).

The thesis lists the 15 models and their batch sizes (Table A.1) but gives per-workload memory only in
figures, except a few numbers in the text: persistent memory "ranging from 110.9 MB for googlenet_25 to
822.2 MB for resnet152_75", peaks "as high as 13.8 GB for resnet152" and "less than 1 GB for vae", iterations
"from tens of milliseconds to a few seconds" (§2.2.1). ``MODELS`` below is **our** table, built to respect
those anchors; everything else in it (per-model peaks, iteration times, compute intensity ``u``, inference
weights) is an assumption, recorded in ``docs/salus.md``. Sizes scale linearly with the batch size.

``u`` in (0, 1] is how much of the device's compute one iteration keeps busy: lanes run concurrently on GPU
streams and Salus does not schedule compute across them (§5.1), so the simulator lets lanes progress at
``min(1, 1 / sum u)`` of their solo speed (our contention model).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.salus.controller import SalusJob


@dataclass(frozen=True)
class Model:
    """One Table A.1 model at its largest batch: persistent and peak MB, solo iteration seconds, ``u``."""

    name: str
    batches: tuple[int, ...]
    persistent_mb: float
    peak_mb: float
    iter_s: float
    u: float
    weights_mb: float  # fp32 parameters only: an inference instance's persistent memory


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("alexnet", (25, 50, 100), 260, 3500, 0.10, 0.60, 233),
    Model("googlenet", (25, 50, 100), 111, 6000, 0.25, 0.80, 27),
    Model("inception3", (25, 50, 100), 300, 9000, 0.50, 0.90, 91),
    Model("inception4", (25, 50, 75), 450, 11000, 0.70, 0.95, 163),
    Model("overfeat", (25, 50, 100), 420, 5000, 0.20, 0.80, 560),
    Model("resnet50", (25, 50, 75), 330, 8500, 0.35, 0.93, 98),
    Model("resnet101", (25, 50, 75), 560, 11500, 0.55, 0.95, 170),
    Model("resnet152", (25, 50, 75), 822, 13800, 0.80, 0.96, 230),
    Model("vgg11", (25, 50, 100), 600, 7000, 0.35, 0.90, 507),
    Model("vgg16", (25, 50, 100), 650, 9000, 0.55, 0.95, 528),
    Model("vgg19", (25, 50, 100), 700, 10000, 0.65, 0.95, 548),
    Model("vae", (64, 128, 256), 22, 35, 0.02, 0.10, 2),
    Model("superres", (32, 64, 128), 40, 900, 0.05, 0.40, 1),
    Model("speech", (25, 50, 75), 250, 4000, 0.30, 0.70, 150),
    Model("seq2seq", (1, 2, 3), 200, 3000, 0.20, 0.60, 100),  # Small, Medium, Large
)}


@dataclass(frozen=True)
class Workload:
    """``<model>_<batch>``: a job's memory (persistent, ephemeral), solo iteration time and ``u``."""

    name: str
    persistent_mb: float
    ephemeral_mb: float
    iter_s: float
    u: float


def workload(name: str) -> Workload:
    """``workload("resnet50_50")``: the model's sizes at that batch (ephemeral and time scale with batch)."""
    model_name, _, batch = name.rpartition("_")
    model = MODELS.get(model_name)
    if model is None or not batch.isdigit() or int(batch) not in model.batches:
        raise ConfigError("workload", name, f"unknown; use <model>_<batch> with a model of {sorted(MODELS)} "
                                            "and one of its Table A.1 batch sizes (seq2seq: 1, 2, 3)")
    scale = int(batch) / model.batches[-1]
    ephemeral = (model.peak_mb - model.persistent_mb) * scale
    return Workload(name, model.persistent_mb, ephemeral, model.iter_s * (0.25 + 0.75 * scale),
                    model.u * (0.5 + 0.5 * scale))


def all_workloads() -> list[str]:
    """The 45 Table A.1 workloads."""
    return [f"{m.name}_{b}" for m in MODELS.values() for b in m.batches]


@dataclass(frozen=True)
class TraceJob:
    """A job of a trace: arrival, workload, iterations; ``salus`` is what the controller is told."""

    salus: SalusJob
    arrival_s: float
    iter_s: float
    iterations: int
    u: float


def trace_job(job_id: str, arrival_s: float, name: str, iterations: int, on_demand: bool = False) -> TraceJob:
    w = workload(name)
    job = SalusJob(job_id, w.persistent_mb, w.ephemeral_mb, expected_s=iterations * w.iter_s, on_demand=on_demand,
                   iterations=None if on_demand else iterations)
    return TraceJob(job, arrival_s, w.iter_s, iterations, w.u)


def tiresias_like_trace(jobs: int, seed: int, mean_gap_s: float, median_s: float, sigma: float) -> list[TraceJob]:
    """A seeded trace: Poisson arrivals, log-normal (heavy-tailed) solo durations, workloads uniform over
    Table A.1 — the shape of the production trace the thesis follows ([25], Tiresias), not its data."""
    rng = np.random.default_rng(seed)
    names = all_workloads()
    arrivals = np.cumsum(rng.exponential(mean_gap_s, jobs)) - mean_gap_s
    arrivals[0] = 0.0
    out = []
    for i, at in enumerate(arrivals):
        w = workload(names[int(rng.integers(len(names)))])
        duration = float(rng.lognormal(np.log(median_s), sigma))
        out.append(trace_job(f"job{i:03d}", float(max(0.0, at)), w.name, max(1, round(duration / w.iter_s))))
    return out


@dataclass(frozen=True)
class InferenceInstance:
    """One served model instance: persistent = weights, ephemeral = forward scratch, one query's solo time."""

    instance_id: str
    persistent_mb: float
    ephemeral_mb: float
    service_s: float
    u: float


def inference_instances(copies: int = 3) -> list[InferenceInstance]:
    """S5 (§2.5.3): ``copies`` instances of the 14 PyTorch models of Fig. A.1 (Table A.1 minus overfeat) at
    their smallest batch; ephemeral = half the training scratch and a query = a third of a training iteration
    (forward only; both ours)."""
    out = []
    for model in MODELS.values():
        if model.name == "overfeat":
            continue
        w = workload(f"{model.name}_{model.batches[0]}")
        out += [InferenceInstance(f"{model.name}#{k}", model.weights_mb, w.ephemeral_mb / 2, w.iter_s / 3, w.u)
                for k in range(copies)]
    return out
