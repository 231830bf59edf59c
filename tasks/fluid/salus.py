"""FLUID's trials packed onto one device as Salus jobs under PACK (``trial_groups --execution salus-pack``).

FLUID packs up to ``c`` trials on a GPU by fractions (Algorithm 3.1, its ``c`` from Eq. 3.1), and then CUDA
decides which trial computes when. Salus packs by memory instead (P. Yu, PhD thesis U. Michigan 2022, Ch. 2):
PACK admits "as many jobs as possible" into lanes with Algorithm 2.1 (§2.4.1), and its hyper-parameter
exploration experiment (§2.5: many small training jobs on one GPU, PACK vs FIFO) is what a TrialGroup of small
trials is. Here every trial the tuning algorithm hands out is one Salus job on the pool's first device: its
declared memory (``trial_memory_mb``) decides its lane, each iteration (one epoch, the loop of
``tasks.fluid.trials.train_epochs``) runs while it holds its lane's token, and jobs in separate lanes train at
once. A trial trains its whole budget in one task: Salus gives no widths to resize. The tuning algorithm
sees completions as under FLUID, so every algorithm (promotions and checkpoints included) runs the same way.

The flow's runner runs in Salus mode for this (``salus_pack_runner``: ``GpuTaskRunner(mode="salus",
salus_policy="pack")`` on the pool's first device): the device's executor leases it whole and charges the jobs
``ΣP + Σ_lanes max E`` inside (Eq. 2.1), each trial task declares its memory (``salus_options``) and is
admitted by the executor instead of leasing a slice, and its worker marks its iterations with
``salus_iterations``.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import task
from prefect.futures import as_completed

from gpu.devices import Device, discover
from gpu.state import state_dir
from gpu.schedulers.fluid.tuning.base import TuningAlgorithm
from tasks.digits import MLP_EPHEMERAL_MB, mlp_resident_mb
from tasks.fluid.packing import digits_split
from tasks.fluid.records import TrialLog, best_result
from tasks.fluid.trials import load_model, model_and_optimizer, train_epochs
from resource_blocks import GpuPool
from tasks.runtime.requests import current_placement, gpu_options
from tasks.salus.executor import MIB, salus_iterations, salus_options
from tasks.report.artifacts import publish_table

EXECUTION = "salus-pack"
MAX_PACKED = 8
"""Trials admitted on the device at once (the executor's ``max_jobs``; process workers keep one each)."""


def trial_memory_mb(config: dict[str, Any]) -> tuple[float, float]:
    """A trial's Salus memory (MiB): persistent = the 64-hidden-10 MLP's fp32 weights, gradients and SGD momentum
    (thesis Observation 2: model and optimizer state), at least 1 MiB; ephemeral = ``MLP_EPHEMERAL_MB``."""
    return mlp_resident_mb(int(config["hidden"]), 3), MLP_EPHEMERAL_MB


def salus_pack_runner(pool: GpuPool, mode: str | None) -> dict[str, Any]:
    """The flow runner's settings for ``salus-pack``: Salus mode, PACK, the pool's first device; jobs in worker
    processes or threads as the flow's ``mode`` says."""
    first = discover(pool.simulated, pool.device_backend).nodes[0].devices[0].index
    return {"mode": "salus", "salus_policy": "pack", "salus_devices": (first,), "max_jobs_per_device": MAX_PACKED,
            "salus_workers": mode if mode in ("process", "thread") else "process"}


@task(name="salus-packed-trial", task_run_name="trial-{trial_id}")
def train_packed(trial_id: str, config: dict[str, Any], start: int, iterations: int, load_from: str | None,
                 save_to: str, seed: int = 0, fail: bool = False) -> dict[str, Any]:
    """Train ``iterations`` epochs of one trial, each an iteration of its Salus lane, from ``load_from``; save the
    state to ``save_to``. Returns the losses, validation accuracies and every iteration's wall-clock span.
    ``fail``: fault injection, the trial raises in its last iteration, holding its lane's token."""
    import torch

    placed = current_placement()
    device = placed.device if placed is not None else "cpu"
    lane = placed.lane if placed is not None else None
    torch.set_num_threads(1)
    torch.manual_seed(seed * 100_003 + start)
    data = tuple(t.to(device) for t in digits_split(seed))
    model, optimizer = model_and_optimizer(config, load_from)
    model.to(device)
    losses, accuracies, spans = [], [], []
    for step in salus_iterations(iterations):
        if fail and step == iterations - 1:
            raise RuntimeError(f"trial {trial_id}: injected failure")
        began = time.time()
        loss, accuracy = train_epochs(model, optimizer, data, int(config["batch_size"]), 1)
        spans.append((began, time.time()))
        losses += loss
        accuracies += accuracy
    torch.save({"model": model.cpu().state_dict(), "optimizer": optimizer.state_dict(),
                "iterations": start + iterations}, save_to)
    devices = list(placed.gpu_indices) if placed is not None else []
    return {"trial_id": trial_id, "start": start, "iterations": iterations, "loss": losses,
            "val_accuracy": accuracies, "devices": devices, "device": device, "width": 0.0,
            "fraction": placed.fraction if placed is not None else 0.0,
            "node": placed.placement.node if placed is not None else "", "data_parallel": 1,
            "note": f"Salus PACK, lane {lane.lane_id if lane else '-'} of device {devices}", "spans": spans,
            "lane": lane.lane_id if lane else None}


def pack_search(algo: TuningAlgorithm, algorithm: str, device: Device, seed: int, fail_trial: str | None,
                tracking_uri: str, model_name: str, parent: str | None) -> dict[str, Any]:
    """Run ``algo``'s trials as Salus jobs under PACK on ``device`` (the flow's runner in Salus mode,
    ``salus_pack_runner``) until it is finished; the flow's summary (the keys of FLUID's, with ``c`` and
    ``lanes`` = the lanes the trials trained in;
    ``makespan_s`` counts from the first submission, the trials' start-up included, ``training_s`` from the
    first iteration's start to the last one's end)."""
    log = TrialLog(parent, tracking_uri)
    folder = state_dir() / "trial_groups" / (parent or f"{algorithm}-{EXECUTION}-{seed}")
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = lambda tid: str(folder / f"{tid.replace('@', '_')}.pt")  # noqa: E731
    t0 = time.monotonic()
    inflight: dict[Any, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    scores: dict[str, float] = {}
    errors: dict[str, str] = {}
    try:
        while not algo.finished:
            group = algo.suggest(MAX_PACKED)
            for trial in group.trials if group else ():
                log.open(trial, algorithm, EXECUTION)
                p_mb, e_mb = trial_memory_mb(trial.config)
                with salus_options(persistent=int(p_mb * MIB), ephemeral=int(e_mb * MIB)), \
                        gpu_options(devices=(device.index,), label=f"trial {trial.trial_id}"):
                    future = train_packed.submit(trial.trial_id, dict(trial.config), int(trial.resume_from),
                                                 max(1, int(round(trial.budget))),
                                                 ckpt(trial.checkpoint) if trial.checkpoint else None,
                                                 ckpt(trial.trial_id), seed, fail=trial.trial_id == fail_trial)
                inflight[future] = trial
            if not inflight:
                raise RuntimeError(f"{algorithm}: not finished, but it suggests nothing and no trial runs")
            future = next(as_completed(list(inflight)))
            trial = inflight.pop(future)
            try:
                out = future.result()
            except Exception as exc:  # the trial failed: recorded (score 1.0 = accuracy 0), the search goes on
                errors[trial.trial_id] = f"{type(exc).__name__}: {exc}"
                scores[trial.trial_id] = 1.0
                log.close(trial.trial_id, ok=False, error=errors[trial.trial_id])
            else:
                results[trial.trial_id] = out
                scores[trial.trial_id] = 1.0 - out["val_accuracy"][-1]
                log.chunk(out, out["start"])
                log.close(trial.trial_id, ok=True)
            algo.on_trial_complete(trial.trial_id, scores[trial.trial_id])
    finally:
        for future in inflight:
            future.wait()
    makespan = time.monotonic() - t0
    spans = [span for r in results.values() for span in r["spans"]]
    best = best_result(algo.results, errors)
    version = log.register(best.trial_id, load_model(best.config, ckpt(best.trial_id)), model_name)
    publish_table(f"fluid-trials-{algorithm}", [
        {"trial": r.trial_id, "config": r.config, "iterations": r.iterations,
         "val_accuracy": None if r.trial_id in errors else 1.0 - r.score, "failed": r.trial_id in errors,
         "lane": results[r.trial_id]["lane"] if r.trial_id in results else None,
         "best": r.trial_id == best.trial_id} for r in algo.results],
        f"Salus PACK / {algorithm}: every trial's configuration, result and the Salus lane it trained in")
    lanes = len({r["lane"] for r in results.values()})
    return {"algorithm": algorithm, "execution": EXECUTION, "c": lanes, "d": 1,
            "alpha": None, "beta": None, "c_source": "Salus PACK: lanes by Algorithm 2.1",
            "d_source": "one device", "makespan_s": makespan, "calibration_s": 0.0, "profiling_s": 0.0,
            "training_s": max(end for _, end in spans) - min(start for start, _ in spans) if spans else 0.0,
            "lanes": lanes,
            "trials": len(scores), "failures": sorted(errors), "errors": errors, "scores": scores,
            "best_trial": best.trial_id, "best_config": best.config, "best_val_accuracy": 1.0 - best.score,
            "iterations_trained": sum(r["iterations"] for r in results.values()),
            "placements": {tid: {k: r[k] for k in ("devices", "lane", "spans")} for tid, r in results.items()},
            "mlflow_errors": log.errors, "mlflow_run_id": log.parent, "trial_runs": dict(log.runs),
            "registered_model": model_name if version else None, "model_version": version}
