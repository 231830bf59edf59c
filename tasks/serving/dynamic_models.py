"""A dynamic DNN for the serving runtime: an early-exit recurrent digits classifier (ORLOJ's setting, Yu 2022 §4.2).

``digits_dynamic`` refines a hidden state step by step and lets an input exit once its prediction is confident
(max softmax ≥ ``threshold``) or after ``max_steps``, as RDI-Nets and SkipNet do with exits and skipped layers
(thesis §4.2.1). A batch keeps looping until every input in it has exited, so the batch costs its slowest
request (padding, Eq. 4.4); a clean digit exits in a step or two, a corrupted one (noise, rotation as in
``tasks.ekya.streams``) needs more. ORLOJ's histograms of the model are alone times of sampled requests
(:func:`alone_times`). ``ExitByInput`` takes its exit from the input instead, so a workload can drift to
heavier work on demand.
"""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np
import torch
from torch import nn

from gpu.schedulers.orloj.policy import Histogram


class EarlyExitDigits(nn.Module):
    """Recurrent refinement with a confidence exit per input; the batch runs until all inputs exited."""

    def __init__(self, hidden: int = 128, max_steps: int = 12, threshold: float = 0.97):
        super().__init__()
        self.embed = nn.Linear(64, hidden)
        self.cell = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden))
        self.head = nn.Linear(hidden, 10)
        self.max_steps, self.threshold = max_steps, threshold

    def _states(self, x: torch.Tensor):
        h = torch.tanh(self.embed(x))
        for _ in range(self.max_steps):
            h = h + torch.tanh(self.cell(h))
            yield self.head(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Each input's logits at its exit step; the loop stops when the whole batch has exited."""
        out = torch.zeros(len(x), 10, dtype=x.dtype, device=x.device)
        done = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        for step, logits in enumerate(self._states(x), 1):
            exit_now = ~done & ((logits.softmax(1).amax(1) >= self.threshold) | (step == self.max_steps))
            out[exit_now] = logits[exit_now]
            done |= exit_now
            if bool(done.all()):
                break
        return out

    def exit_steps(self, x: torch.Tensor) -> torch.Tensor:
        """How many steps each input runs alone (what its batch-mates make it wait for in a batch)."""
        steps = torch.full((len(x),), self.max_steps, dtype=torch.long)
        for step, logits in enumerate(self._states(x), 1):
            hit = (logits.softmax(1).amax(1) >= self.threshold) & (steps == self.max_steps)
            steps[hit] = step
        return steps

    def training_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Deep supervision: every step's logits learn the label, so early exits are meaningful."""
        return torch.stack([nn.functional.cross_entropy(logits, y) for logits in self._states(x)]).mean()


def alone_times(model: nn.Module, rows_by_app: Mapping[str, np.ndarray], repeats: int = 3,
                bins: int = 50) -> dict[str, Histogram]:
    """ORLOJ's profiling step (§4.3.2): each sampled request timed alone (best of ``repeats``), per application."""
    out = {}
    with torch.inference_mode():
        for app, rows in rows_by_app.items():
            times = []
            for row in torch.from_numpy(np.asarray(rows, np.float32)).split(1):
                best = np.inf
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    model(row).argmax(1).tolist()
                    best = min(best, (time.perf_counter() - t0) * 1000.0)
                times.append(best)
            out[app] = Histogram.from_samples(times, bins)
    return out


class ExitByInput(nn.Module):
    """A dynamic DNN whose inputs say how many of its (12) wide layers they take before exiting (feature 0,
    rounded, at least 1: an exit an upstream router decided, like SkipNet's gates, §4.2.1); a batch runs until
    its deepest input exits (padding, Eq. 4.4). Inputs that ask for more layers are heavier real work with no
    configuration changed, which is how the measured-feedback tests drift a workload mid-run."""

    def __init__(self, width: int = 1024, layers: int = 12):
        super().__init__()
        self.embed = nn.Linear(64, width)  # a digits row, as EarlyExitDigits
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        depth = int(x[:, 0].round().clamp(1, len(self.layers)).max())
        h = torch.tanh(self.embed(x))
        for layer in self.layers[:depth]:
            h = torch.tanh(layer(h))
        return self.head(h)


def depth_rows(depth: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` random input rows that take ``depth`` layers of ``ExitByInput``."""
    x = np.random.default_rng(seed).random((n, 64), dtype=np.float32)
    x[:, 0] = depth
    return x
