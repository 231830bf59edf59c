"""The training task FLUID places: one trial of a TrialGroup trains a torch MLP on digits for a chunk of iterations.

A trial runs as a sequence of Prefect tasks, one per chunk of iterations, so that DynamicFluid's resizes take
effect at iteration boundaries (thesis §3.3.3): each chunk loads the trial's checkpoint (model + optimizer
state), trains, validates after every iteration (= one epoch over the training split) and saves the checkpoint
again; the next chunk is submitted at the trial's new width. A promoted trial (Hyperband/ASHA rung, PBT exploit)
starts from the checkpoint of the trial it continues.

A trial wider than one GPU trains with ``torch.nn.DataParallel`` across its devices when torch sees them (one
process, each batch split over the GPUs: a tiny MLP does not warrant a DDP process group per chunk). Where it
cannot (a simulated pool, or fewer CUDA devices than the placement), it runs on one device and says so: the
chunk's result carries ``data_parallel`` (devices actually used) and a ``note`` the flow logs to MLflow.

Each chunk's training is timed with ``tasks.runtime.slices.on_slice``: the result carries ``slice_s`` (the chunk's
training time on the slice it held) and its wall-clock ``started_at``/``finished_at``, so the flow can compare
what FLUID predicted with what ran and show trials packed on one device running at once.

``packing_curve`` measures Eq. 3.1 on the device it was placed on (``tasks.fluid.packing``), for a flow that
derives FLUID's ``c`` at start-up; ``tasks.fluid.profiling`` measures each trial's iteration time and ``beta``
with the same training loop (``train_epochs``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from gpu.schedulers.fluid.algorithms import PackingCurve
from tasks.fluid.packing import build_mlp, digits_split, measure_packing_curve
from tasks.runtime.requests import current_placement
from tasks.runtime.slices import on_slice


def data_parallel_ids(placed: Any) -> list[int]:
    """CUDA device ids a wide trial trains across, or [] when it must run on one device.

    Process mode sets ``CUDA_VISIBLE_DEVICES`` to the placement's GPUs (torch sees them as 0..k-1); thread
    mode leaves every GPU visible and the placement's pool indices are the torch ids.
    """
    if placed is None or not placed.device.startswith("cuda") or len(placed.gpu_indices) < 2:
        return []
    import torch

    ids = list(range(len(placed.gpu_indices))) if placed.visible_devices else list(placed.gpu_indices)
    return ids if torch.cuda.device_count() > max(ids) else []


def train_epochs(net, optimizer, data: tuple, batch: int, iterations: int) -> tuple[list[float], list[float]]:
    """``iterations`` epochs over the training split, validating after each: (losses, validation accuracies).

    One FLUID iteration is one epoch here; the trial chunks and the profiler (``tasks.fluid.profiling``) both
    run this loop, so a profiled iteration is exactly the work a trial's iteration does.
    """
    import torch
    import torch.nn.functional as F

    xt, yt, xv, yv = data
    losses, accuracies = [], []
    for _ in range(iterations):
        net.train()
        total = 0.0
        for idx in torch.randperm(len(xt)).split(batch):
            optimizer.zero_grad()
            loss = F.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        net.eval()
        with torch.no_grad():
            accuracies.append(float((net(xv).argmax(1) == yv).float().mean()))
        losses.append(total / len(xt))
    return losses, accuracies


def model_and_optimizer(config: dict[str, Any], checkpoint: str | None = None):
    import torch

    model = build_mlp(config["hidden"])
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config["lr"]), momentum=0.9)
    if checkpoint is not None and Path(checkpoint).exists():
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # PBT's explore may have changed the learning rate
            group["lr"] = float(config["lr"])
    return model, optimizer


def load_model(config: dict[str, Any], checkpoint: str):
    """The trained model saved in ``checkpoint`` (for registering the best trial)."""
    return model_and_optimizer(config, checkpoint)[0].eval()


@task(name="fluid-packing-curve")
def packing_curve(iterations: int, max_p: int = 4, hidden: int = 64, batch: int = 64) -> PackingCurve:
    """Eq. 3.1 measured on the device this task was placed on (submit it holding a whole GPU), flow's MLP."""
    placed = current_placement()
    device = placed.device if placed is not None else "cpu"
    get_run_logger().info("measuring the packing curve on %s: p = 1..%d x %d iterations", device, max_p,
                          iterations)
    return measure_packing_curve(device, max_p=max_p, iterations=iterations, hidden=hidden, batch=batch)


@task(name="fluid-trial-chunk")
def train_chunk(trial_id: str, config: dict[str, Any], start: int, iterations: int, load_from: str | None,
                save_to: str, width: float, seed: int = 0, fail: bool = False) -> dict[str, Any]:
    """Train ``iterations`` epochs of one trial from ``load_from`` and save the state to ``save_to``.

    Returns ``{"trial_id", "start", "iterations", "loss": [...], "val_accuracy": [...], "devices", "device",
    "width", "fraction", "node", "data_parallel", "note", "slice_s", "started_at", "finished_at"}`` (placement
    as the runner granted it; ``slice_s`` the training time on that slice, ``tasks.runtime.slices``).
    """
    import torch

    log = get_run_logger()
    placed = current_placement()
    device = placed.device if placed is not None else "cpu"
    devices = list(placed.gpu_indices) if placed is not None else []
    fraction = placed.fraction if placed is not None else 0.0
    parallel = data_parallel_ids(placed)
    if parallel:
        note = f"data-parallel (torch DataParallel) across cuda:{parallel}"
    elif len(devices) > 1:
        note = (f"width {width:g} on pool devices {devices}, but torch sees no CUDA devices for them: runs on one "
                f"device ({device}), no data parallelism")
    else:
        note = f"{fraction:g} of device {devices} ({device})"
    log.info("trial %s, iterations %d-%d: %s", trial_id, start, start + iterations, note)
    if fail:
        raise RuntimeError(f"trial {trial_id}: injected failure")
    torch.set_num_threads(1)
    torch.manual_seed(seed * 100_003 + start)
    xt, yt, xv, yv = digits_split(seed)
    model, optimizer = model_and_optimizer(config, load_from)
    model.to(device)
    net = torch.nn.DataParallel(model, device_ids=parallel) if parallel else model
    data = tuple(t.to(device) for t in (xt, yt, xv, yv))
    started_at = time.time()
    with on_slice(placed) as clock:
        losses, accuracies = train_epochs(net, optimizer, data, int(config["batch_size"]), iterations)
    finished_at = time.time()
    Path(save_to).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.cpu().state_dict(), "optimizer": optimizer.state_dict(),
                "iterations": start + iterations}, save_to)
    return {"trial_id": trial_id, "start": start, "iterations": iterations, "loss": losses,
            "val_accuracy": accuracies, "devices": devices, "device": device, "width": width, "fraction": fraction,
            "node": placed.placement.node if placed is not None else "", "data_parallel": max(1, len(parallel)),
            "note": note, "slice_s": clock.timing.slice_s, "started_at": started_at, "finished_at": finished_at}
