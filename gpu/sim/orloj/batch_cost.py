"""Measured batch costs for the ORLOJ simulator: a padded batch's time from a timed dynamic DNN, not a chosen formula.

``tasks.serving.batch_costs`` times the shipped dynamic torch models for b = 1..32 and every exit depth and writes
a JSON table (``scenarios/orloj/batch_costs/cpu.json``; its ``command`` field regenerates it, ``--device cuda:0``
on a GPU). A padded batch runs as deep as its deepest request (Eq. 4.4), and its time is a line in that depth per batch
size, ``ms[b][d] ≈ F(b) + W(b)·d``: ``W(b)`` the time per layer (step) of ``b`` rows, ``F(b) = φ0 + φ1·b`` the
batch-independent part (embedding, head, the framework's per-call cost), one least-squares fit over the whole
table. One line for ``F`` rather than an intercept per batch size: on a small model the fixed part is a fraction
of one step, and 32 separate intercepts were within their own noise of zero (some negative).

A workload's alone times are placed on the network's depth range: its P99 alone time runs every layer, so
``a = u·(F(1) + W(1)·d)`` with ``u = P99 / (F(1) + D·W(1))``; a request shorter than ``u·F(1)`` runs no layer.
A batch of ``k`` whose longest request takes ``a`` alone then costs ``u·F(k) + (W(k)/W(1))·(a − u·F(1))``:
``gpu.schedulers.orloj.cost_model.PaddedBatchModel`` with ``c0 = u·F(1)``, ``fixed_growth = F(k)/F(1)`` and
``growth = W(k)/W(1)``. The thesis fits ``c0, c1`` by profiling (§4.3); it leaves the depth a synthetic
distribution stands for open, and anchoring its P99 at the full depth is our choice (``docs/orloj.md``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpu.errors import ConfigError
from gpu.plugin import ROOT
from gpu.schedulers.orloj.cost_model import PaddedBatchModel

DEFAULT_PROFILE = ROOT / "scenarios" / "orloj" / "batch_costs" / "cpu.json"
NETWORK = "digits_dynamic"  # the early-exit model the serving rollout serves (tasks.serving.dynamic_models)


@dataclass(frozen=True, eq=False)
class DepthProfile:
    """One network's measured batch times and their per-batch-size line in depth."""

    network: str
    device: str
    batch_sizes: tuple[int, ...]
    depths: tuple[int, ...]
    ms: np.ndarray  # ms[i, j]: a batch of batch_sizes[i] at depth depths[j]
    fixed_ms: np.ndarray  # F(b), per batch size
    per_depth_ms: np.ndarray  # W(b), per batch size

    @classmethod
    def fit(cls, network: str, device: str, sizes: tuple[int, ...], depths: tuple[int, ...], ms: np.ndarray,
            where: str = "cost.profile") -> "DepthProfile":
        """The table ``ms`` (batch sizes × depths) and its fit; a table that cannot be one is a ConfigError
        naming ``where``."""
        if sizes[:1] != (1,) or list(sizes) != sorted(set(sizes)) or len(depths) < 2 or ms.shape != (len(sizes),
                                                                                                       len(depths)):
            raise ConfigError(where, network, "need batch sizes from 1 up, two or more depths and one time per cell")
        if not (np.all(np.isfinite(ms)) and np.all(ms > 0)):
            raise ConfigError(where, network, "every measured time must be finite and > 0 ms")
        fixed, per_depth = _fit(np.asarray(sizes, float), np.asarray(depths, float), ms)
        if not (np.all(per_depth > 0) and fixed[0] > 0):
            raise ConfigError(where, network, f"{network}'s batches must grow with their depth from a positive fixed "
                                              f"part (fit: F(1) = {fixed[0]:.4g} ms, min W = {per_depth.min():.4g} ms)")
        return cls(network, device, tuple(sizes), tuple(depths), ms, fixed, per_depth)

    def model(self, p99_alone_ms: float) -> PaddedBatchModel:
        """The batch model of a workload whose P99 alone time runs the network's every layer (for every batch size
        up to the table's largest, interpolated between measured sizes)."""
        if not (np.isfinite(p99_alone_ms) and p99_alone_ms > 0):
            raise ConfigError("p99_alone_ms", p99_alone_ms, "need a finite P99 alone time > 0 ms")
        unit = p99_alone_ms / (self.fixed_ms[0] + max(self.depths) * self.per_depth_ms[0])
        ks = np.arange(1, max(self.batch_sizes) + 1)
        per_depth = np.interp(ks, self.batch_sizes, self.per_depth_ms)
        fixed = np.interp(ks, self.batch_sizes, self.fixed_ms)
        return PaddedBatchModel(float(unit * self.fixed_ms[0]), _ratios(per_depth), _ratios(fixed))

    def growth(self, b: int) -> float:
        """W(b)/W(1): what b rows of one layer cost in rows of one."""
        return float(self.per_depth_ms[self.batch_sizes.index(b)] / self.per_depth_ms[0])


def _ratios(values: np.ndarray) -> tuple[float, ...]:
    """``v(k)/v(1)``, made nondecreasing (a faster larger batch is timing noise: it would make padding free)."""
    r = np.maximum.accumulate(values / values[0])
    return tuple(float(v) for v in r)


def load_profile(path: str | Path = DEFAULT_PROFILE, network: str = NETWORK) -> DepthProfile:
    """Read a ``tasks.serving.batch_costs`` table; every problem is a ConfigError naming ``cost.profile``."""
    where = "cost.profile"
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(where, str(path), f"cannot read a batch-cost table: {exc}") from None
    try:
        sizes = tuple(int(b) for b in raw["batch_sizes"])
        depths = tuple(int(d) for d in raw["depths"])
        nets = dict(raw["networks"])
        ms = np.asarray(nets[network]["ms"], float) if network in nets else None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(where, str(path), f"not a batch-cost table (tasks.serving.batch_costs): {exc!r}") from None
    if ms is None:
        raise ConfigError("cost.network", network, f"not in {path}; it has {sorted(nets)}")
    try:
        return DepthProfile.fit(network, str(raw.get("device", "?")), sizes, depths, ms)
    except ConfigError as exc:
        raise ConfigError(where, str(path), str(exc).split(": ", 1)[-1]) from None


def _fit(sizes: np.ndarray, depths: np.ndarray, ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ms[i, j] ≈ φ0 + φ1·sizes[i] + W_i·depths[j]`` by least squares: ``(F per size, W per size)``. A
    negative ``φ1`` (a fixed part that shrinks as the batch grows) is noise and counts as 0."""
    n, m = ms.shape
    design = np.zeros((n * m, 2 + n))
    design[:, 0] = 1.0
    design[:, 1] = np.repeat(sizes, m)
    design[np.arange(n * m), 2 + np.repeat(np.arange(n), m)] = np.tile(depths, n)
    coef = np.linalg.lstsq(design, ms.ravel(), rcond=None)[0]
    if coef[1] < 0:
        design[:, 1] = 0.0
        coef = np.linalg.lstsq(design, ms.ravel(), rcond=None)[0]
    return coef[0] + coef[1] * sizes, coef[2:]
