"""Heavier real work for tests that check a scheduler decides from what it measured: the same trained model, run
``copies`` times per request.

A model made wider costs more, but by how much depends on the machine (a layer that outgrows the cache costs 3x
more per unit, and the wider model must be trained again); ``copies`` passes cost ``copies`` x the work on any
machine, give the trained model's answers and train nothing."""

from __future__ import annotations

import torch


class Ensemble(torch.nn.Module):
    """``copies`` passes of one trained model, logits averaged."""

    def __init__(self, model: torch.nn.Module, copies: int):
        super().__init__()
        self.model, self.copies = model, copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.model(x) for _ in range(self.copies)]).mean(dim=0)
