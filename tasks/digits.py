"""The real work several systems' tasks train and serve: sklearn's bundled 8×8 digits (1797 images, no
download) and a one-hidden-layer MLP over them.

Small enough to run on a CPU in a test, real enough that making the model wider makes every step measurably
heavier — which is what the flows' "decisions from measurements" rest on.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


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
