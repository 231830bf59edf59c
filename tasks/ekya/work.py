"""Ekya's torch work as Prefect tasks: golden model, micro-profiling, retraining, inference.

Setup (thesis §2.2, §2.4): every stream serves a small classifier
(64-``hidden``-10 MLP); a larger "golden" model (64-128-128-10, trained once on all of digits
under random drift) labels a sample of each window's frames, and retraining fine-tunes the
deployed model on those labels (knowledge distillation). Inference accuracy is measured against
the true labels.

Retraining configurations (thesis §2.4, "Retraining configurations"): epochs x layers retrained
("last" = only the output layer, "all") x fraction of the window's labelled data.

Every cost the scheduler sees is *measured* from the torch work on the task's slice with
``tasks.runtime.slices.on_slice`` (GPU: synchronised wall time on the slice; simulated pool: the thread's CPU
time divided by the share). Times are reported two ways: ``slice_s``, the time on the slice the task
held (what the window's timeline advances by), and ``gpu_s = slice_s x share``, the same work on one
whole GPU (Ekya's "GPU seconds", what the thief's cost model divides by a share). The micro-profiler
trains each (layers, fraction) pair on ``profile_fraction`` of that data for ``profile_epochs`` epochs
from the deployed model (batch scaled down by the same fraction, so an epoch has as many optimiser
steps as the real one), records golden-label validation accuracy and the measured GPU-seconds of every
epoch (training steps only); the engine's ``micro_profile`` fits and extrapolates it (one profile run
serves every epoch count). It also times the deployed model on single frames: the inference cost that
says how much GPU the live frame rate needs.

Inference serves a period of ``period_s`` slice seconds: the model runs frame by frame on the task's
slice, the measured time gives the frame rate the slice sustains (``min(1, period_s / slice_s)``), and
the stream is served at that rate: evenly spaced frames are processed and the others answered with the
newest processed frame's prediction (stale; ``tasks.ekya.streams.serve``). With no GPUs the stream is not
served and those frames count as wrong.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from gpu.errors import ConfigError
from gpu.scenario import MAX_COUNT
from gpu.schedulers.ekya.profiler import ProfileObservation
from gpu.state import state_dir
from tasks.runtime.requests import current_placement
from tasks.salus.executor import salus_iterations
from tasks.salus.placement import Lane
from tasks.runtime.slices import on_slice
from tasks.ekya.streams import StreamSpec, augmented_digits, processed_mask, serve, training_views, window_frames

LAYERS = ("last", "all")
GOLDEN_HIDDEN = (128, 128)


@dataclass(frozen=True)
class ConfigSpec:
    """One retraining configuration gamma."""

    name: str
    epochs: int
    layers: str  # "last" or "all"
    data_fraction: float

    def __post_init__(self) -> None:
        if self.layers not in LAYERS:
            raise ConfigError(f"{self.name}.layers", self.layers, f"choose one of {LAYERS}")
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ConfigError(f"{self.name}.epochs", self.epochs, "must be a whole number >= 1")
        if not 0 < self.data_fraction <= 1:
            raise ConfigError(f"{self.name}.data_fraction", self.data_fraction, "must be in (0, 1]")


def config_grid(epochs: tuple[int, ...] = (5, 15, 30), layers: tuple[str, ...] = LAYERS,
                fractions: tuple[float, ...] = (0.25, 0.5, 1.0)) -> tuple[ConfigSpec, ...]:
    """The 18-config space (thesis §2.4, the paper's code): epochs x layers retrained x data fraction."""
    return tuple(ConfigSpec(f"e{e}-{lay}-d{round(f * 100)}", e, lay, f)
                 for lay in layers for f in fractions for e in epochs)


@dataclass(frozen=True)
class WindowSettings:
    """Sizes and costs shared by every task of a flow run."""

    frames: int = 1000  # live frames per window (inference)
    labelled: int = 1000  # frames per window the golden model labels (80% train, 20% validation)
    hidden: int = 32
    profile_fraction: float = 0.5  # of each config's data (paper: 5-10%; our windows are small)
    profile_epochs: int = 5
    batch: int = 32
    lr: float = 0.01
    golden_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("frames", "labelled", "hidden", "profile_epochs", "batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (10 if name in ("frames", "labelled") else 1) \
                    or v > MAX_COUNT:
                raise ConfigError(name, v, f"must be a whole number (frames/labelled >= 10, others >= 1; at most "
                                           f"{MAX_COUNT:,})")
        if not 0 < self.profile_fraction <= 1:
            raise ConfigError("profile_fraction", self.profile_fraction, "must be in (0, 1]")

    @property
    def n_train(self) -> int:
        return self.labelled - self.labelled // 5


def _net(hidden: tuple[int, ...]):
    import torch

    dims = (64, *hidden, 10)
    layers: list[Any] = []
    for a, b in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def small_net(settings: WindowSettings):
    return _net((settings.hidden,))


def _setup() -> Any:
    import torch

    torch.set_num_threads(1)  # tasks run side by side on few cores
    p = current_placement()
    device = torch.device(p.device if p else "cpu")
    _warm_up(str(device))
    return device


@lru_cache(maxsize=None)
def _warm_up(device: str) -> None:
    """One training step before anything is timed: torch's first step (lazy kernels, allocator) costs
    seconds, which would otherwise land in the first measured epoch."""
    import torch

    model = small_net(WindowSettings()).to(device)
    x = torch.zeros(4, 64, device=device)
    torch.nn.functional.cross_entropy(model(x), torch.zeros(4, dtype=torch.long, device=device)).backward()
    torch.optim.Adam(model.parameters()).step()


def _accuracy(model, x: np.ndarray, y: np.ndarray, device) -> float:
    return float(np.mean(_predict(model, x, device) == y)) if len(y) else 0.0


def _predict(model, x: np.ndarray, device) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(x, device=device)).argmax(1).cpu().numpy()


@dataclass(frozen=True)
class Fit:
    """What a training run did: validation accuracy per epoch and the measured time of its training steps."""

    history: tuple[float, ...]  # validation accuracy after each epoch (empty without ``val``)
    epochs: int  # epochs run
    slice_s: float  # time of the training steps on the task's slice (``tasks.runtime.slices``)
    gpu_s: float  # the same work on one whole GPU (slice_s x share)


def _fit(model, x: np.ndarray, y: np.ndarray, epochs: int, layers: str, settings: WindowSettings, seed: int,
         device, val: tuple[np.ndarray, np.ndarray] | None = None, budget_s: float = float("inf"),
         lane: Lane | None = None) -> Fit:
    """Train ``model`` in place, timing each epoch's steps on the slice; stop once ``budget_s`` slice
    seconds are spent (the window has ended for this job). In a Salus ``lane`` every SGD step is one
    iteration: it runs only while the job holds the lane's token."""
    import torch

    params = list(model.parameters())
    trainable = params[-2:] if layers == "last" else params
    for p in params:
        p.requires_grad_(any(p is t for t in trainable))
    opt = torch.optim.Adam(trainable, lr=settings.lr)
    gen = torch.Generator().manual_seed(seed)
    xs, ys = torch.as_tensor(x, device=device), torch.as_tensor(y, device=device)
    history, slice_s, gpu_s, done = [], 0.0, 0.0, 0
    turns = _turns(epochs * -(-len(xs) // settings.batch), lane)
    while done < epochs and slice_s <= budget_s:
        model.train()
        with on_slice() as clock:
            for idx in torch.randperm(len(xs), generator=gen).split(settings.batch):
                next(turns)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
                opt.step()
        slice_s += clock.timing.slice_s
        gpu_s += clock.timing.slice_s * clock.timing.share
        done += 1
        model.eval()
        if val is not None:
            history.append(_accuracy(model, *val, device))
    if done == epochs:
        next(turns, None)  # ends the last iteration; a job the budget stopped holds its turn until it leaves
    for p in params:
        p.requires_grad_(True)
    return Fit(tuple(history), done, slice_s, gpu_s)


def _turns(n: int, lane: Lane | None) -> Any:
    """An iterator whose every ``next`` starts one Salus iteration (``tasks.salus.executor.salus_iterations``);
    without a lane, ``range(n)``."""
    return iter(salus_iterations(n, lane=lane) if lane is not None else range(n))


def _load(state: dict, settings: WindowSettings, device):
    model = small_net(settings).to(device)
    model.load_state_dict(state)
    return model.eval()


def _cpu_state(model) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


@lru_cache(maxsize=64)
def _frames(spec: StreamSpec, window: int, n: int, part: str) -> tuple[np.ndarray, np.ndarray]:
    return window_frames(spec, window, n, part)


@lru_cache(maxsize=4)
def _golden(path: str):
    import torch

    model = _net(GOLDEN_HIDDEN)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


# -- tasks ------------------------------------------------------------------------------------

@task(cache_policy=NO_CACHE)
def train_golden(seed: int = 0, samples: int = 4000, epochs: int = 8) -> str:
    """Train the golden model once (cached in the state folder); returns its checkpoint path."""
    import torch

    path = state_dir() / "ekya" / f"golden-s{seed}-n{samples}-e{epochs}.pt"
    if path.exists():
        return str(path)
    device = _setup()
    x, y = augmented_digits(samples, seed)
    torch.manual_seed(seed)
    model = _net(GOLDEN_HIDDEN).to(device)
    _fit(model, x, y, epochs, "all", WindowSettings(batch=64, lr=0.003), seed, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.time_ns()}.tmp")
    torch.save(_cpu_state(model), tmp)
    tmp.replace(path)  # atomic: concurrent flows never read half a file
    return str(path)


@task(cache_policy=NO_CACHE, task_run_name="bootstrap-{spec.name}")  # the Prefect UI names what it worked on
def bootstrap_model(spec: StreamSpec, settings: WindowSettings, samples: int = 800, epochs: int = 30) -> dict:
    """The stream's first deployed model: trained on its undrifted history (window -1)."""
    import torch

    device = _setup()
    torch.manual_seed(spec.seed % 2**31)
    x, y = _frames(spec, -1, samples, "history")
    model = small_net(settings).to(device)
    _fit(model, x, y, epochs, "all", settings, spec.seed, device)
    return _cpu_state(model)


@dataclass(frozen=True)
class WindowProfile:
    """What micro-profiling one stream's window found (accuracies against golden labels, costs measured)."""

    stream: str
    golden_labels: np.ndarray  # for the window's labelled frames (train split first)
    current_accuracy: float  # deployed model on the golden-labelled validation split
    golden_accuracy: float  # golden labels vs true labels on the labelled frames
    observations: tuple[ProfileObservation, ...]  # seconds_per_epoch: measured GPU-seconds (whole GPU)
    frame_gpu_s: float  # measured GPU-seconds (whole GPU) the deployed model takes per live frame
    real_s: float


def _frame_by_frame(model, x: np.ndarray, device) -> tuple[np.ndarray, float, float]:
    """Predictions for ``x`` one frame at a time (as a live stream arrives), with the slice and GPU time."""
    import torch

    out = np.empty(len(x), dtype=np.int64)
    with torch.no_grad(), on_slice() as clock:
        frames = torch.as_tensor(x, device=device)
        for k in range(len(x)):
            out[k] = int(model(frames[k:k + 1]).argmax(1)[0])
    return out, clock.timing.slice_s, clock.timing.slice_s * clock.timing.share


@task(cache_policy=NO_CACHE, task_run_name="profile-{spec.name}-w{window}")  # the Prefect UI names what it worked on
def profile_window(spec: StreamSpec, window: int, model_state: dict, golden_path: str,
                   configs: tuple[ConfigSpec, ...], settings: WindowSettings) -> WindowProfile:
    """Golden-label the window's sample, time the deployed model per frame, then micro-profile every
    (layers, fraction) pair of ``configs`` (accuracy and measured GPU-seconds per epoch)."""
    import copy

    start = time.perf_counter()
    device = _setup()
    x, y_true = _frames(spec, window, settings.labelled, "train")
    golden = _predict(_golden(golden_path).to(device), x, device)
    n = settings.n_train
    val = (x[n:], golden[n:])
    model = _load(model_state, settings, device)
    _, _, infer_gpu_s = _frame_by_frame(model, x[n:], device)
    observations = []
    rng = np.random.default_rng([spec.seed, window, 7])
    for layers, fraction in sorted({(c.layers, c.data_fraction) for c in configs}):
        size = min(n, max(settings.batch, round(settings.profile_fraction * fraction * n)))
        sample = rng.choice(n, size=size, replace=False)
        trial = copy.deepcopy(model)
        # An epoch on the sample takes as many optimiser steps as one on the config's data, so the
        # per-epoch curve stands for the full-data curve (thesis §2.4, "Micro-profiler") without a 1/fraction bias.
        small = replace(settings, batch=max(2, round(settings.batch * size / (fraction * n))))
        xs, ys = training_views(spec, x[sample], golden[sample], window)
        fit = _fit(trial, xs, ys, settings.profile_epochs, layers, small, spec.seed, device, val)
        per_epoch = max(fit.gpu_s / fit.epochs, 1e-9)
        observations += [ProfileObservation(c.name, tuple(float(k) for k in range(1, fit.epochs + 1)), fit.history,
                                            per_epoch, size / n, float(c.epochs), c.data_fraction)
                         for c in configs if (c.layers, c.data_fraction) == (layers, fraction)]
    return WindowProfile(spec.name, golden, _accuracy(model, *val, device), float(np.mean(golden == y_true)),
                         tuple(observations), max(infer_gpu_s / max(1, len(x) - n), 1e-9), time.perf_counter() - start)


@dataclass(frozen=True)
class RetrainResult:
    stream: str
    config: str
    state: dict
    val_accuracy: float  # against golden labels
    epochs_done: int
    complete: bool  # False: the window ended first (the model is discarded)
    slice_s: float  # measured time of the retraining on its slice: when it deploys, after its start
    gpu_s: float  # the same work on one whole GPU
    real_s: float


class InjectedFailure(RuntimeError):
    """Raised by a retraining task told to fail (fault-injection tests and demos)."""


@task(cache_policy=NO_CACHE, task_run_name="retrain-{spec.name}-w{window}-{config.name}")  # the Prefect UI names what it worked on
def retrain(spec: StreamSpec, window: int, model_state: dict, golden_labels: np.ndarray, config: ConfigSpec,
            settings: WindowSettings, budget_s: float = float("inf"), fail: bool = False,
            lane: Lane | None = None) -> RetrainResult:
    """Fine-tune the deployed model with ``config`` on the window's golden-labelled frames.

    The job stops once its measured slice time passes ``budget_s`` (what is left of the window) and then
    reports ``complete=False``. ``lane``: a Salus lane whose tokens its SGD steps take (``tasks.ekya.salus``).
    """
    start = time.perf_counter()
    device = _setup()
    x, _ = _frames(spec, window, settings.labelled, "train")
    n = settings.n_train
    rng = np.random.default_rng([spec.seed, window, 11])
    data = rng.choice(n, size=max(1, round(config.data_fraction * n)), replace=False)
    xs, ys = training_views(spec, x[data], golden_labels[data], window)
    model = _load(model_state, settings, device)
    if fail:
        _fit(model, xs, ys, 1, config.layers, settings, spec.seed, device, lane=lane)
        raise InjectedFailure(f"injected failure while retraining {spec.name} with {config.name} in window {window}")
    fit = _fit(model, xs, ys, config.epochs, config.layers, settings, spec.seed, device, budget_s=budget_s, lane=lane)
    return RetrainResult(spec.name, config.name, _cpu_state(model),
                         _accuracy(model, x[n:], golden_labels[n:], device), fit.epochs,
                         fit.epochs == config.epochs and fit.slice_s <= budget_s, fit.slice_s, fit.gpu_s,
                         time.perf_counter() - start)


@dataclass(frozen=True)
class SegmentResult:
    stream: str
    start: int  # first frame index
    frames: int
    processed: int
    correct: int  # served answers equal to the true label
    rate: float = 0.0  # frame rate the slice sustained (measured)
    slice_s: float = 0.0  # measured time to run the model on every frame of the period on the slice


@task(cache_policy=NO_CACHE, task_run_name="infer-{spec.name}-w{window}-f{first}")  # the Prefect UI names what it worked on
def infer_segment(spec: StreamSpec, window: int, model_state: dict, first: int, last: int, period_s: float,
                  settings: WindowSettings) -> SegmentResult:
    """Serve live frames ``[first, last)`` that arrive over ``period_s`` slice seconds at the frame rate the
    task's slice sustains (measured); stale answers for skipped frames."""
    device = _setup()
    x, y = _frames(spec, window, settings.frames, "live")
    x, y = x[first:last], y[first:last]
    preds, slice_s, _ = _frame_by_frame(_load(model_state, settings, device), x, device)
    return serve_period(spec.name, first, preds, y, slice_s, period_s)


def serve_period(stream: str, first: int, preds: np.ndarray, truth: np.ndarray, slice_s: float,
                 period_s: float) -> SegmentResult:
    """A period's answers: the frame rate ``slice_s`` of work sustains over ``period_s`` decides which frames
    were processed; skipped frames get the newest processed frame's prediction."""
    rate = min(1.0, period_s / slice_s) if slice_s > 0 else 1.0
    mask = processed_mask(len(truth), rate)
    answers = serve(np.where(mask, preds, -1), mask)
    return SegmentResult(stream, first, len(truth), int(mask.sum()), int(np.sum(answers == truth)), rate, slice_s)


FRAMES_PER_ITERATION = 10
"""Live frames one Salus inference iteration serves (a batch of a stream's frames, still run frame by frame)."""


@dataclass(frozen=True)
class FrameAnswers:
    """A model's predictions for live frames ``first, first+1, ...`` with each frame's measured slice time."""

    stream: str
    first: int
    preds: np.ndarray
    truth: np.ndarray
    slice_s: np.ndarray  # per frame: its batch's measured time on the slice, split evenly over the batch

    def segment(self, last: int, period_s: float) -> SegmentResult:
        """The period ``[first, last)`` served over ``period_s`` slice seconds, as ``infer_segment`` serves it."""
        k = last - self.first
        return serve_period(self.stream, self.first, self.preds[:k], self.truth[:k], float(self.slice_s[:k].sum()),
                            period_s)


@task(cache_policy=NO_CACHE, task_run_name="infer-{spec.name}-w{window}-f{first}-on")  # the Prefect UI names what it worked on
def infer_frames(spec: StreamSpec, window: int, model_state: dict, first: int, settings: WindowSettings,
                 lane: Lane | None = None) -> FrameAnswers:
    """Run the model on live frames ``first`` to the window's end, ``FRAMES_PER_ITERATION`` frames per Salus
    iteration of ``lane``: started when a period opens, before its end is known (``tasks.ekya.salus``)."""
    device = _setup()
    x, y = _frames(spec, window, settings.frames, "live")
    x, y = x[first:], y[first:]
    model = _load(model_state, settings, device)
    batches = range(0, len(x), FRAMES_PER_ITERATION)
    turns = _turns(len(batches), lane)
    preds, times = np.empty(len(x), dtype=np.int64), np.empty(len(x))
    for b in batches:
        next(turns)
        part = slice(b, b + FRAMES_PER_ITERATION)
        preds[part], slice_s, _ = _frame_by_frame(model, x[part], device)
        times[part] = slice_s / len(preds[part])
    next(turns, None)
    return FrameAnswers(spec.name, first, preds, y, times)


def checkpoint(state: dict, path: Path) -> Path:
    """Save a model state in the state folder (the flow keeps every deployed version)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path
