"""Check 5a: Ekya's flow on CUDA (thesis §2.4): one retraining window of two drifting streams on this machine's GPUs.

Runs ``flows.continuous_retraining`` itself (thief policy, process mode, a pool of the NVML devices), so the
micro-profiler, the thief's decision and the retraining jobs all run their torch work on the device. For every
retraining the flow reports the micro-profiler's predicted duration (its epochs' measured GPU-seconds,
extrapolated to the chosen configuration and divided by the job's share) and the duration the job measured on its
slice; the check holds them within a factor ``BAND`` of each other and reports the accuracy prediction's error
beside the paper's (Fig. 2.11a: a median absolute error of 5.8%).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.report import Outcome, verdict

BAND = 3.0  # measured / predicted retraining time within [1/3, 3]
PAPER_ACCURACY_ERROR = 0.058  # Fig. 2.11a, median absolute error of the micro-profiler's accuracy estimate


def check(settings: Settings) -> Outcome:
    from flows.continuous_retraining import continuous_retraining
    from resource_blocks import GpuPool

    frames, windows = (300, 1) if settings.quick else (1000, 2)
    pool = GpuPool(name="gpu-check-ekya", device_backend="nvml")
    summary = continuous_retraining(streams=2, windows=windows, pool=pool, mode="process", tracking=False,
                                    frames=frames, labelled=frames)
    return judge(summary)


def judge(summary: dict[str, Any]) -> Outcome:
    """Every retraining completed, its measured time within ``BAND`` of the prediction."""
    jobs = [(w["window"], stream, job) for w in summary["windows"] for stream, job in w["retrainings"].items()]
    failures = []
    if not jobs:
        failures.append("no stream retrained in any window")
    ratios: dict[str, float | None] = {f"w{w['window']}_{stream}": None for w in summary["windows"]
                                       for stream in summary["streams"]}
    errors, parts = [], []
    for window, stream, job in jobs:
        if job["state"] != "COMPLETED":
            failures.append(f"w{window} {stream} retraining ended {job['state']}")
            continue
        ratio = job["measured_s"] / job["predicted_s"]
        ratios[f"w{window}_{stream}"] = ratio
        if not 1 / BAND <= ratio <= BAND:
            failures.append(f"w{window} {stream}: {job['measured_s']:.2f} s measured vs {job['predicted_s']:.2f} s "
                            f"predicted")
        if job["measured_accuracy"] is not None:
            errors.append(abs(job["measured_accuracy"] - job["predicted_accuracy"]))
        parts.append(f"{stream} {job['config']} {job['measured_s']:.2f}/{job['predicted_s']:.2f} s")
    error = float(np.median(errors)) if errors else float("nan")
    figure = (f"retraining measured/predicted: {', '.join(parts)}; accuracy error {100 * error:.1f}% "
              f"(paper 5.8%); mean accuracy {summary['mean_accuracy']:.3f}")
    figures = {**{f"time_ratio_{key}": value for key, value in ratios.items()}, "accuracy_error_median": error,
               "paper_accuracy_error": PAPER_ACCURACY_ERROR, "mean_accuracy": summary["mean_accuracy"],
               "retrainings": len(jobs)}
    return verdict("ekya", failures, figure, figures)
