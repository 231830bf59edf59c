"""The real work several systems' tasks train and serve: sklearn's bundled 8×8 digits (1797 images, no
download) and a one-hidden-layer MLP over them.

Small enough to run on a CPU in a test, real enough that making the model wider makes every step measurably
heavier — which is what the flows' "decisions from measurements" rest on.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


MLP_EPHEMERAL_MB = 64.0
"""Per-iteration memory of ``mlp`` as a Salus job: a batch's activations are kilobytes; CUDA's caching allocator
takes 2 MiB blocks and cuBLAS an 8 MiB workspace per stream, so 64 MiB is a generous ceiling."""


def mlp_resident_mb(hidden: int, copies: int) -> float:
    """Resident memory (MiB) of ``mlp(hidden)`` (Salus thesis Observation 2: model and optimizer state): its fp32
    weights held ``copies`` times — 1 to serve; with gradients and the optimizer's state to train (3 for SGD with
    momentum, 4 for Adam) — at least 1 MiB."""
    params = (64 + 1) * hidden + (hidden + 1) * 10
    return max(1.0, params * 4 * copies / 2 ** 20)


@lru_cache(maxsize=4)
def digits_tensors(device: Any = "cpu") -> tuple[Any, Any]:
    """Images scaled to [0, 1] as float32 (N × 64) and labels, on ``device``; cached per device (read-only)."""
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32, device=device), torch.tensor(y, device=device)


def mlp(hidden: int, seed: int, device: Any = "cpu") -> Any:
    """64 → ``hidden`` → 10 with ReLU, initialised from ``seed`` (torch's global generator)."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(device)
