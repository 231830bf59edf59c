"""FLUID's profiler (thesis §3.5): measured iteration times and scaling, so trials' runtimes are not their budgets.

"FLUID thus uses a small fraction of resources to profile current trials and reuse the result throughout the
whole tuning session." Two measurements, both on the flow's real training loop (``tasks.fluid.trials``):

* ``profile_trial`` — a short run of one model shape (hidden width, batch size) on a ``1/c`` slice of a device,
  each iteration timed with ``tasks.runtime.slices.on_slice`` (the median counts). The slice's time is turned into ``t1`` (seconds per iteration on one
  whole device) with the rule ``on_slice`` itself applies: a fraction ``f`` of a device delivers ``f`` of its
  throughput, so ``t1 = slice_s * f``. The learning rate does not change the work of an iteration, so one
  profile per shape serves every trial (and every promotion) of that shape.
* ``profile_scaling`` — the flow's reference MLP (the packing curve's model) at widths 1..k on k whole devices,
  data-parallel where torch sees the devices; ``gpu.schedulers.fluid.algorithms.fit_scaling`` gives ``beta`` (Eq. 3.2),
  and ``max_parallelism`` the limit ``d``. On a simulated pool a wide trial runs on one device, its time does
  not drop, and ``d`` comes out 1: what a user of that pool would get.

``calibrate`` sets the session's ``c``/``alpha`` (packing curve, Eq. 3.1) and ``beta``/``d`` (scaling) before
the first trial; ``TrialProfiler`` is the flow's ``TuningSession.profile``: it profiles a group's new shapes side
by side (each on a ``1/c`` slice) and attaches the measured ``t1`` (and the session's ``alpha``/``beta``) to
each trial before FLUID sees it, so StaticFluid weighs trials by ``budget * t1`` — their measured runtimes, not
their budgets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from prefect import task

from gpu.schedulers.fluid.algorithms import (PackingCurve, ScalingCurve, Trial, fit_scaling, load_packing_curve, max_parallelism,
                                  packing_curve_path)
from tasks.fluid.packing import digits_split
from tasks.fluid.trials import data_parallel_ids, model_and_optimizer, packing_curve, train_epochs
from tasks.runtime.requests import current_placement, gpu_options
from tasks.runtime.slices import enforce, on_slice

PROFILE_ITERATIONS = 3  # separately timed iterations per trial profile (median), after one untimed warm-up
SCALING_ROUNDS = 7  # samples per width of the scaling measurement (the fastest counts), 3 iterations each
SCALING_SAMPLE = 3
SCALING_MIN_GAIN = 0.20  # a wider trial must be > 20 % faster: the same work timed on a loaded 2-core machine differed by 11 %
REFERENCE_SHAPE = {"hidden": 64, "batch_size": 64, "lr": 0.05}  # the packing curve's model (tasks.fluid.packing)
PACKING_MAX_P = 4  # levels of the start-up packing measurement (c is capped at the largest level measured)
SCALING_MAX_WIDTH = 4  # widest data-parallel run of the start-up scaling measurement
DEFAULT_ALPHA = 1.5  # with an explicit c and no alpha: consistent with c = 2 by Eq. 3.1


def _trainer(config: dict[str, Any], device: str, parallel: list[int], seed: int) -> Callable[[], Any]:
    """``config``'s model and optimizer, warmed by one untimed iteration; returns one timed iteration's call.

    The call runs one iteration inside ``on_slice`` and returns its ``SliceTiming``.
    """
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    data = tuple(t.to(device) for t in digits_split(seed))
    model, optimizer = model_and_optimizer(config)
    model.to(device)
    net = torch.nn.DataParallel(model, device_ids=parallel) if parallel else model
    batch = int(config["batch_size"])
    train_epochs(net, optimizer, data, batch, 1)

    def iteration():
        with on_slice() as clock:
            train_epochs(net, optimizer, data, batch, 1)
        return clock.timing

    return iteration


@task(name="fluid-trial-profile")
def profile_trial(hidden: int, batch_size: int, iterations: int = PROFILE_ITERATIONS, seed: int = 0) -> dict[str, Any]:
    """Seconds per iteration of one model shape on one whole device, measured on this task's slice.

    The median of ``iterations`` separately timed iterations (robust to a neighbour's burst).
    Returns ``{"hidden", "batch_size", "iter_s", "slice_s", "share", "emulated", "device"}``.
    """
    placed = current_placement()
    enforce(placed)
    device = placed.device if placed is not None else "cpu"
    config = {"hidden": hidden, "batch_size": batch_size, "lr": REFERENCE_SHAPE["lr"]}
    iteration = _trainer(config, device, [], seed)
    timings = [iteration() for _ in range(iterations)]
    slice_s = float(np.median([t.slice_s for t in timings]))
    share = timings[0].share
    return {"hidden": hidden, "batch_size": batch_size, "iter_s": slice_s * share, "slice_s": slice_s,
            "share": share, "emulated": timings[0].emulated, "device": device}


@task(name="fluid-scaling-profile")
def profile_scaling(widths: list[int], rounds: int = SCALING_ROUNDS, seed: int = 0) -> dict[str, Any]:
    """Seconds per iteration of the reference MLP at each width, on this task's whole devices.

    Width k trains data-parallel over the first k devices torch sees (``data_parallel_ids``), else on one
    device (simulated pool). The widths take turns, ``SCALING_SAMPLE`` iterations each, for ``rounds`` rounds,
    and each width's fastest sample counts: drift on a busy machine hits every width alike instead of the one
    measured last, and other load only ever adds time. Returns ``{"widths", "iter_s", "data_parallel"}``.
    """
    placed = current_placement()
    device = placed.device if placed is not None else "cpu"
    ids = data_parallel_ids(placed)
    parallel = [ids[:k] if k >= 2 and len(ids) >= k else [] for k in widths]
    trainers = [_trainer(dict(REFERENCE_SHAPE), device, p, seed) for p in parallel]
    times = np.array([[sum(trainer().slice_s for _ in range(SCALING_SAMPLE)) / SCALING_SAMPLE for trainer in trainers]
                      for _ in range(rounds)])
    return {"widths": list(widths), "iter_s": [float(v) for v in times.min(axis=0)],
            "data_parallel": [max(1, len(p)) for p in parallel]}


@dataclass
class TrialProfiler:
    """``TuningSession.profile`` for the flow: measured ``t1`` per model shape, the session's ``alpha``/``beta``.

    Args:
        share: the slice a profile runs on (``1/c``: "a small fraction of resources", §3.5).
        alpha, beta: packing and scaling overheads measured for this session (Eq. 3.2).
        seed: the flow's seed (data split and initial weights of the profiled model).
    """

    share: float
    alpha: float
    beta: float
    seed: int = 0
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)  # "hidden=H batch=B" -> profile_trial's result
    seconds: float = 0.0  # wall time the flow waited for profiles

    def __call__(self, trials: Sequence[Trial]) -> list[Trial]:
        """The group's trials with measured ``t1``: the shapes not yet profiled are measured side by side."""
        keys = [self._key(t) for t in trials]
        missing = {k: shape for k, shape in keys if k not in self.profiles}
        if missing:
            t0 = time.monotonic()
            futures = {}
            for key, shape in missing.items():
                with gpu_options(gpus=self.share, label=f"profile {key}"):
                    futures[key] = profile_trial.submit(*shape, seed=self.seed)
            self.profiles.update((key, future.result()) for key, future in futures.items())
            self.seconds += time.monotonic() - t0
        return [replace(t, iter_time_s=self.profiles[key]["iter_s"], alpha=self.alpha, beta=self.beta)
                for t, (key, _) in zip(trials, keys)]

    @staticmethod
    def _key(trial: Trial) -> tuple[str, tuple[int, int]]:
        shape = (int(trial.config["hidden"]), int(trial.config["batch_size"]))
        return f"hidden={shape[0]} batch={shape[1]}", shape


@dataclass(frozen=True)
class Calibration:
    """The session's FLUID parameters and where each came from (given, saved, or measured at start)."""

    c: int
    d: int
    alpha: float
    beta: float
    c_source: str
    d_source: str
    curve: PackingCurve | None = None
    scaling: ScalingCurve | None = None
    seconds: float = 0.0  # wall time the measurements took


def saved_or_measured_curve(device: str, gpu: int, iterations: int) -> tuple[PackingCurve, str]:
    """The device's saved packing curve (``benchmarks/fluid_packing.py``), else a short one measured now.

    The measurement runs as a task holding pool device ``gpu`` whole, so it sees that device alone (on a
    simulated pool: this machine's CPU, where the trials will run too).
    """
    saved = load_packing_curve(device)
    if saved is not None:
        return saved, f"saved curve {packing_curve_path(device)}"
    with gpu_options(gpus=1.0, devices=(gpu,), label="packing curve"):
        measured = packing_curve.submit(iterations, PACKING_MAX_P).result()
    return measured, f"measured at start on {device} (device {gpu}, p = 1..{PACKING_MAX_P} x {iterations} iterations)"


def trials_per_device(c: Any, device: str) -> int:
    """The most trials FLUID may pack on one device this session: ``c`` when given, else the largest level of the
    packing curve it will be derived from (a fitted ``c`` never exceeds it). The process runner keeps that many
    workers per device set, so packed trials really run at once."""
    if isinstance(c, int) and not isinstance(c, bool) and c >= 1:
        return c
    saved = load_packing_curve(device)
    return max(saved.ps) if saved is not None else PACKING_MAX_P


def calibrate(execution: str, gpus: list[int], device: str, c: int | None, d: int | None, alpha: float | None,
              packing_iterations: int, seed: int = 0,
              scaling_times: Callable[[list[int]], list[float]] | None = None) -> Calibration:
    """FLUID's ``c``, ``alpha`` (Eq. 3.1 packing curve) and ``beta``, ``d`` (Eq. 3.2 scaling), measured where not given.

    ``scaling_times`` measures seconds per iteration at each width where a wide trial is not one task on pinned
    devices (ESCHER placement: gangs of data-parallel workers, ``tasks.fluid.escher``).

    FIFO runs one trial per whole GPU: nothing to pack or spread, nothing measured (``c = d = 1``).
    """
    t0 = time.monotonic()
    if execution == "fifo":
        return Calibration(c or 1, d or 1, alpha or 1.0, 1.0, "given" if c else "fifo: one trial per GPU, no packing",
                           "given" if d else "fifo: one GPU per trial")
    curve, c_source = None, "given"
    if c is None:
        curve, c_source = saved_or_measured_curve(device, gpus[0], packing_iterations)
        c, alpha = curve.c, curve.alpha if alpha is None else alpha
    scaling, beta, d_source = None, 1.0, "given" if d is not None else "one GPU in the pool"
    if len(gpus) >= 2:
        widths = list(range(1, min(len(gpus), SCALING_MAX_WIDTH) + 1))
        if scaling_times is not None:
            iter_s, where = scaling_times(widths), "as gangs of data-parallel workers"
        else:
            with gpu_options(gpus=float(widths[-1]), devices=tuple(gpus[: widths[-1]]), label="scaling profile"):
                iter_s = profile_scaling.submit(widths, seed=seed).result()["iter_s"]
            where = f"on devices {gpus[:widths[-1]]}"
        scaling = fit_scaling(widths, iter_s)
        beta = scaling.beta
        if d is None:
            d = max_parallelism(beta, len(gpus), min_gain=SCALING_MIN_GAIN)
            d_source = f"measured at start: beta {beta:.3g} over widths {widths} {where}"
    return Calibration(c, d or 1, DEFAULT_ALPHA if alpha is None else alpha, beta, c_source, d_source, curve, scaling,
                       time.monotonic() - t0)
