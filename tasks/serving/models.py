"""Tiny real torch models that the serving runtime hosts, and the Nexus-style profiler for them.

Three classifiers of the 8×8 digits of ``sklearn.datasets.load_digits`` (1797 images, bundled with
scikit-learn), chosen so their batching profiles ℓ(b) differ in shape the way the paper's models do
(Nexus §6.1, Eq. 1): ``digits_mlp`` has a large fixed cost and a tiny per-input cost (batching is almost
free), ``digits_cnn_small`` is in between, ``digits_cnn`` has the steepest per-input cost. ``digits_dynamic``
(``tasks.serving.dynamic_models``) exits early on confident inputs: its latency depends on the data (ORLOJ).

The profiler follows the authors' tool (``tools/profiler``): per batch size 4 dry runs, then 10
timed runs, turned into a :class:`BatchProfile` by ``profile_from_measurements`` exactly like the
published profiles, so the squishy packer plans for our models the way it plans for VGG.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from gpu.errors import ConfigError
from gpu.schedulers.nexus.profiles import BatchProfile, profile_from_measurements
from gpu.state import state_dir
from tasks.serving.dynamic_models import EarlyExitDigits

PROFILE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
INPUT_FEATURES = 64  # every served model takes one digits image, 8×8 values in a row


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def _cnn_small() -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10))


ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "digits_mlp": _mlp,
    "digits_cnn_small": _cnn_small,
    "digits_cnn": _cnn,
    "digits_dynamic": EarlyExitDigits,  # early exits: a request's time depends on its input (ORLOJ)
}


@dataclass(frozen=True)
class Digits:
    """The digits data as float tensors in [0, 1] (inputs are flat 64-vectors), split 80/20."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits_tensors(seed: int = 0) -> Digits:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    cut = int(0.8 * len(x))
    tr, te = perm[:cut], perm[cut:]
    return Digits(x[tr], y[tr], x[te], y[te])


def check_model(name: str, where: str = "model") -> str:
    """``name`` if it is one of our architectures, else ConfigError naming ``where``."""
    if name not in ARCHITECTURES:
        raise ConfigError(where, name, f"unknown model; choose one of {sorted(ARCHITECTURES)}")
    return name


def train_model(name: str, steps: int = 300, seed: int = 0, data: Digits | None = None) -> nn.Module:
    """Train one architecture with Adam (batch 64) on the digits; returns it in eval mode on the CPU."""
    check_model(name)
    data = data or load_digits_tensors(seed)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = ARCHITECTURES[name]()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        idx = torch.randint(0, len(data.x_train), (64,), generator=gen)
        x, y = data.x_train[idx], data.y_train[idx]
        loss = model.training_loss(x, y) if hasattr(model, "training_loss") else nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def accuracy(model: nn.Module, data: Digits) -> float:
    with torch.inference_mode():
        return float((model(data.x_test).argmax(1) == data.y_test).float().mean())


def load_or_train(name: str, steps: int = 300, seed: int = 0, cache: Path | None = None) -> nn.Module:
    """The trained model from the state folder, training (and saving) it on first use."""
    check_model(name)
    folder = cache or state_dir() / "serving" / "models"
    path = folder / f"{name}-s{seed}-n{steps}.pt"
    model = ARCHITECTURES[name]()
    if path.is_file():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    model = train_model(name, steps, seed)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)  # atomic: concurrent trainers never leave a torn file
    return model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(model: nn.Module, device: str = "cpu", batches: Sequence[int] = PROFILE_BATCHES,
            repeats: int = 10, warmup: int = 4) -> list[tuple[int, float]]:
    """``(batch, ms)`` samples: ``warmup`` dry runs then ``repeats`` timed runs per batch size (Nexus profiler)."""
    if repeats < 1 or warmup < 0:
        raise ConfigError("repeats", repeats, "need repeats >= 1 and warmup >= 0")
    dev = torch.device(device)
    model = model.to(dev).eval()
    samples: list[tuple[int, float]] = []
    with torch.inference_mode():
        for b in batches:
            x = torch.rand(int(b), INPUT_FEATURES, device=dev)
            for _ in range(warmup):
                model(x).argmax(1).tolist()
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(x).argmax(1).tolist()  # the worker's full step: forward, argmax, copy back
                _sync(dev)
                samples.append((int(b), (time.perf_counter() - t0) * 1000.0))
    return samples


def profile_model(name: str, model: nn.Module, device: str = "cpu", batches: Sequence[int] = PROFILE_BATCHES,
                  repeats: int = 10, warmup: int = 4, keep: float = 0.5) -> BatchProfile:
    """The batching profile of one of our models on ``device``, built like the published ones.

    Only the fastest ``keep`` share of each batch size's timed runs is kept (a trimmed mean): the authors
    profile on a dedicated GPU, while a shared CPU pre-empts the odd run and one such run would dominate
    a mean of ten — and through the least-squares fill of unmeasured sizes, every size near it (seen:
    ℓ(24) = 7.5 ms for a model whose ℓ(64) is 0.13 ms, with an 80 % trim on a machine at load 15).
    """
    if not 0 < keep <= 1:
        raise ConfigError("keep", keep, "must be in (0, 1]")
    by: dict[int, list[float]] = {}
    for b, ms in measure(model, device, batches, repeats, warmup):
        by.setdefault(b, []).append(ms)
    kept = [(b, ms) for b, v in by.items() for ms in sorted(v)[:max(1, int(round(keep * len(v))))]]
    return profile_from_measurements(name, kept)
