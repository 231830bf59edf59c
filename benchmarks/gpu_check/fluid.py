"""Check 5b: FLUID's flow on CUDA (thesis §3.3-3.5): one grid TrialGroup on this machine's GPUs.

Runs ``flows.trial_groups`` itself (FLUID execution, process mode, a pool of the NVML devices) with a fresh state
folder, so no saved curve exists and the flow measures the device's packing curve at start (Eq. 3.1: p = 1..4
trainers of its MLP on one device, fitted ``alpha`` and ``c``) and profiles each trial's seconds per iteration on a
``1/c`` slice (§3.5). Each trial's time is then predicted by Eq. 3.2 from what was profiled (``h1`` and the width
FLUID gave it: ``gpu.schedulers.fluid.algorithms.runtime``) and compared with the time its chunks measured on their
slices (within a factor ``BAND``). The curve is reported as the aggregate throughput of p packed trials over one
trial's (G1; the paper: one small trial uses "at most 60%" of a GPU, so packing pays).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.report import Outcome, verdict

BAND = 3.0  # a trial's measured / predicted time within [1/3, 3]


def check(settings: Settings) -> Outcome:
    from flows.trial_groups import trial_groups
    from resource_blocks import GpuPool

    iterations, packing = (2, 150) if settings.quick else (4, 300)
    summary = trial_groups(algorithm="grid", iterations=iterations, pool=GpuPool(name="gpu-check-fluid",
                                                                                  device_backend="nvml"),
                           execution="fluid", mode="process", packing_iterations=packing, tracking=False, progress=False)
    return judge(summary)


def predicted_s(trial: dict[str, Any], chunks: list[dict[str, Any]], alpha: float, beta: float) -> float:
    """Eq. 3.2 over the trial's chunks: each chunk's share of ``h1`` at the width it ran with."""
    from gpu.schedulers.fluid.algorithms import runtime

    return sum(runtime(trial["h1_s"] / len(chunks), chunk["width"], alpha, beta) for chunk in chunks)


def judge(summary: dict[str, Any]) -> Outcome:
    """All trials trained, the curve measured on the device, each trial's time within ``BAND`` of Eq. 3.2's."""
    failures = []
    curve = summary["packing_curve"]
    if curve is None or "measured at start" not in summary["c_source"]:
        failures.append(f"the packing curve was not measured on the device: {summary['c_source']}")
    if summary["failures"]:
        failures.append(f"trials failed: {summary['errors']}")
    ratios = {}
    for tid, times in summary["trial_times"].items():
        chunks = summary["placements"].get(tid, [])
        if not chunks:
            continue
        ratios[tid] = times["slice_s"] / predicted_s(times, chunks, summary["alpha"], summary["beta"])
    off = {tid: r for tid, r in ratios.items() if not 1 / BAND <= r <= BAND}
    if off:
        failures.append("measured/predicted trial time off: " + ", ".join(f"{t} {r:.2f}" for t, r in off.items()))
    gains = [] if curve is None else [x / curve["iters_per_s"][0] for x in curve["iters_per_s"]]
    mean = float(np.mean(list(ratios.values()))) if ratios else float("nan")
    figure = (f"c={summary['c']} alpha={summary['alpha']:.2f} (p=1..{len(gains)} gain "
              f"{', '.join(f'{g:.2f}' for g in gains)}); {len(ratios)} trials measured/Eq.3.2 {mean:.2f}x; "
              f"best acc {summary['best_val_accuracy']:.3f}")
    figures = {"c": summary["c"], "alpha": summary["alpha"], "beta": summary["beta"], "d": summary["d"],
               "packing_gains": gains, "time_ratio_mean": mean, "time_ratios": list(ratios.values()),
               "makespan_s": summary["makespan_s"], "trials": summary["trials"],
               "best_val_accuracy": summary["best_val_accuracy"]}
    return verdict("fluid", failures, figure, figures)
