"""Check 5b: FLUID on CUDA (thesis §3.3-3.5): the packing curve measured on the device, one TrialGroup run.

``flows.trial_groups`` cannot run on the GPU machine: ``gpu.schedulers.fluid.tuning`` expands a search space with
``ray.tune``, and Ray does not fit in the machine's transfer. So the check drives the flow's own device-side pieces
for one grid TrialGroup (the flow's ``GRID_SPACE``, four trials) on ``GpuTaskRunner`` (process mode) over the NVML
devices:

1. ``tasks.fluid.profiling.calibrate``: with a fresh state folder no curve is saved, so the flow's start-up
   measurement runs on the device (Eq. 3.1: p = 1..4 trainers of its MLP, fitted ``alpha`` and ``c``; ``beta``
   and ``d`` where there are 2+ GPUs);
2. ``TrialProfiler``: each model shape's seconds per iteration on a ``1/c`` slice (§3.5, ``profile_trial``);
3. FLUID's executor (``build_executor("fluid")``: StaticFluid, Algorithm 3.1) places the group, and each trial
   trains its whole budget as one ``train_chunk`` at the width FLUID gave it, the next queued trial starting when
   one ends (``on_trial_done``).

Each trial's time on its slice is compared with Eq. 3.2's prediction from what was profiled
(``gpu.schedulers.fluid.algorithms.runtime`` of ``h1`` at its width), within a factor ``BAND``. The curve is
reported as the aggregate throughput of p packed trials over one trial's (G1; the paper: one small trial uses "at
most 60%" of a GPU, so packing pays).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from prefect import flow

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.report import Outcome, verdict

BAND = 3.0  # a trial's measured / predicted time within [1/3, 3]
SEED = 0


def grid_group(space: dict[str, Any], iterations: int):
    """The TrialGroup of a space of ``Grid`` and ``Choice`` axes (their values' cross product), named as
    ``gpu.schedulers.fluid.tuning`` names a grid's trials (``c0000@0`` ...), each with a budget of
    ``iterations``."""
    from gpu.schedulers.fluid.algorithms import Trial, TrialGroup

    names = sorted(space)
    configs = [dict(zip(names, values)) for values in itertools.product(*(space[n].values for n in names))]
    return TrialGroup("g0", tuple(Trial(f"c{i:04d}@0", iterations, config) for i, config in enumerate(configs)))


@flow(name="gpu-check-fluid")
def fluid_flow(pool: Any, iterations: int, packing_iterations: int, workdir: str) -> dict[str, Any]:
    """Calibrate, profile and run one TrialGroup (module docstring, steps 1-3); every trial's outcome."""
    from prefect.futures import as_completed

    from flows.trial_groups import GRID_SPACE, device_model
    from gpu.devices import discover
    from gpu.schedulers.fluid.algorithms import FluidParams, TrialGroup
    from gpu.schedulers.fluid.policies import build_executor
    from tasks.fluid.profiling import TrialProfiler, calibrate
    from tasks.fluid.trials import train_chunk
    from tasks.runtime.requests import gpu_options

    gpus = [d.index for d in discover(pool.simulated, pool.device_backend).nodes[0].devices]
    cal = calibrate("fluid", gpus, device_model(pool), None, None, None, packing_iterations, SEED)
    group = grid_group(GRID_SPACE, iterations)
    trials = {t.trial_id: t for t in TrialProfiler(1.0 / cal.c, cal.alpha, cal.beta, SEED)(group.trials)}
    executor = build_executor("fluid", gpus, FluidParams(c=cal.c, d=cal.d))
    t0 = time.monotonic()
    inflight, done = {}, {}

    def start(step) -> None:
        for p in step.starts:
            t = trials[p.trial_id]
            with gpu_options(gpus=p.width if p.width < 1 else float(len(p.gpus)), devices=p.gpus,
                             label=f"trial {p.trial_id}"):
                future = train_chunk.submit(p.trial_id, dict(t.config), 0, int(t.budget), None,
                                            f"{workdir}/{p.trial_id.replace('@', '_')}.pt", p.width, SEED)
            inflight[future] = p.trial_id

    start(executor.on_group(0.0, TrialGroup(group.group_id, tuple(trials.values()))))
    while inflight:
        future = next(as_completed(list(inflight)))
        trial_id = inflight.pop(future)
        done[trial_id] = {**future.result(), "h1_s": trials[trial_id].h1}
        start(executor.on_trial_done(time.monotonic() - t0, trial_id))
    return {"c": cal.c, "d": cal.d, "alpha": cal.alpha, "beta": cal.beta, "c_source": cal.c_source,
            "iters_per_s": list(cal.curve.throughputs) if cal.curve else [], "trials": done,
            "makespan_s": time.monotonic() - t0}


def check(settings: Settings) -> Outcome:
    from resource_blocks import GpuPool
    from tasks.fluid.profiling import PACKING_MAX_P
    from tasks.runtime.runners import GpuTaskRunner

    iterations, packing = (2, 150) if settings.quick else (6, 300)
    pool = GpuPool(name="gpu-check-fluid", device_backend="nvml")
    runner = GpuTaskRunner(pool=pool, mode="process", workers_per_device_set=PACKING_MAX_P, tracking=False)
    return judge(fluid_flow.with_options(task_runner=runner)(pool, iterations, packing, str(settings.workdir)))


def judge(seen: dict[str, Any]) -> Outcome:
    """The curve measured on the device, every trial trained, each within ``BAND`` of Eq. 3.2's prediction."""
    from gpu.schedulers.fluid.algorithms import runtime

    failures = []
    if "measured at start" not in seen["c_source"]:
        failures.append(f"the packing curve was not measured on the device: {seen['c_source']}")
    ratios = {tid: r["slice_s"] / runtime(r["h1_s"], r["width"], seen["alpha"], seen["beta"])
              for tid, r in sorted(seen["trials"].items())}
    off = {tid: ratio for tid, ratio in ratios.items() if not 1 / BAND <= ratio <= BAND}
    if off:
        failures.append("measured/predicted trial time off: " + ", ".join(f"{t} {r:.2f}" for t, r in off.items()))
    curve = seen["iters_per_s"]
    gains = [x / curve[0] for x in curve] if curve else []
    widths = sorted({round(r["width"], 3) for r in seen["trials"].values()})
    figure = (f"c={seen['c']} alpha={seen['alpha']:.2f} (p=1..{len(gains)}: {', '.join(f'{g:.2f}' for g in gains)}x); "
              f"{len(ratios)} trials at widths {widths}, measured/Eq.3.2 "
              f"{', '.join(f'{r:.2f}' for r in ratios.values())}")
    figures = {"c": seen["c"], "d": seen["d"], "alpha": seen["alpha"], "beta": seen["beta"], "packing_gains": gains,
               "time_ratios": list(ratios.values()), "widths": [r["width"] for r in seen["trials"].values()],
               "makespan_s": seen["makespan_s"], "trials": len(ratios)}
    return verdict("fluid", failures, figure, figures)
