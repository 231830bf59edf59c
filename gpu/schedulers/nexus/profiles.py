"""Batching profiles ℓ(b) for Nexus and the latency rules the scheduler evaluates on them.

Nexus (Shen et al., SOSP'19) §6.1, Eq. (1): a model's *batching profile* is the latency of one batch of
``b`` inputs on a GPU, measured by a profiler "for different batch sizes when the models are uploaded";
the linear fit ``ℓ(b) = αb + β`` (β fixed invocation cost, α per-input cost) is used for analysis.

The scheduler reads profiles through an :class:`Accounting` preset (docs/nexus.md, ``preset``):

* ``PAPER`` — bare mean latency; saturated rule ``2ℓ(b) ≤ L``; residual rule ``b/r + ℓ(b) ≤ L``.
* ``CODE`` — the authors' code: ``ℓ = mean + std``, per-request pre/post-processing (mean + std)
  subtracted from the SLO, a 2 ms network allowance in the saturated rule, residual rule
  ``(b−1)/r + ℓ(b) + pre + post ≤ L`` with duty ``min(L − ℓ − pre − post, b/r)``.

Times are milliseconds, rates requests per second throughout.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Iterable, Mapping

import numpy as np
import pandas as pd
from scipy import stats

from gpu.errors import ConfigError

_DATA_PACKAGE = "gpu.data.nexus"
PUBLISHED_MODELS = ("vgg16", "vgg_face", "vgg_s", "yolo9000")
_FILES = {
    "vgg16": "titan_x_pascal__caffe_vgg16_1",
    "vgg_face": "titan_x_pascal__caffe_vgg_face_1",
    "vgg_s": "titan_x_pascal__caffe_vgg_s_1",
    "yolo9000": "titan_x_pascal__darknet_yolo9000_1",
}
TITAN_X_MEMORY_BYTES = 12 * 1024**3
TOL_MS = 1e-6  # latencies are float arithmetic (µs / 1000, αb + β, sums of batches): 1 ns forgives its rounding


def fits(latency_ms: float, budget_ms: float) -> bool:
    """``latency_ms ≤ budget_ms`` up to float rounding: the one comparison every latency rule uses, so a
    batch whose latency equals its budget is accepted however the two were computed."""
    return latency_ms <= budget_ms + TOL_MS


@dataclass(frozen=True)
class BatchProfile:
    """Measured latency of one batch per allowed batch size (ms), for one model on one GPU type.

    ``batches`` need not be contiguous (the paper's Table 2 only lists 4, 8, 16): a batch of ``b`` inputs
    runs padded to the smallest profiled size ``≥ b``; sizes above the largest profiled one are infeasible.
    """

    model: str
    batches: tuple[int, ...]
    latency_ms: tuple[float, ...]
    std_ms: tuple[float, ...] = ()
    memory_bytes: tuple[int, ...] = ()
    pre_ms: float = 0.0
    post_ms: float = 0.0
    _index: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.batches or len(self.batches) != len(self.latency_ms):
            raise ConfigError(f"{self.model}.batches", self.batches, "need one latency per batch size")
        if list(self.batches) != sorted(set(self.batches)) or self.batches[0] < 1:
            raise ConfigError(f"{self.model}.batches", self.batches, "must be increasing integers >= 1")
        if any(not math.isfinite(v) or v <= 0 for v in self.latency_ms):
            raise ConfigError(f"{self.model}.latency_ms", self.latency_ms, "latencies must be finite and > 0")
        for name in ("std_ms", "memory_bytes"):
            if getattr(self, name) and len(getattr(self, name)) != len(self.batches):
                raise ConfigError(f"{self.model}.{name}", len(getattr(self, name)), "one value per batch size")
        self._index.update({b: i for i, b in enumerate(self.batches)})

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    def slot(self, b: int) -> int:
        """Index of the profiled size a batch of ``b`` runs as (smallest size ≥ b)."""
        if b < 1 or b > self.max_batch:
            raise ConfigError(f"{self.model}.batch", b, f"outside the profiled range 1..{self.max_batch}")
        i = self._index.get(b)
        return i if i is not None else int(np.searchsorted(self.batches, b))

    def latency(self, b: int) -> float:
        """Mean latency (ms) of one batch of ``b`` inputs."""
        return self.latency_ms[self.slot(b)]

    def std(self, b: int) -> float:
        return self.std_ms[self.slot(b)] if self.std_ms else 0.0

    def memory(self, b: int) -> int:
        return self.memory_bytes[self.slot(b)] if self.memory_bytes else 0


@dataclass(frozen=True)
class LinearFit:
    """ℓ(b) = alpha·b + beta (ms), Eq. (1), with the fit's R²."""

    alpha_ms: float
    beta_ms: float
    r2: float

    def __call__(self, b: float) -> float:
        return self.alpha_ms * b + self.beta_ms


@dataclass(frozen=True)
class Accounting:
    """Which latency the scheduler charges (presets ``paper``: §6.1 as printed; ``code``: the authors' code)."""

    name: str
    add_std: bool = False
    multiplier: float = 1.0
    overheads: bool = False
    network_ms: float = 0.0
    residual_minus_one: bool = False

    def latency(self, p: BatchProfile, b: int) -> float:
        """Batch latency the planner assumes (ms)."""
        return (p.latency(b) + (p.std(b) if self.add_std else 0.0)) * self.multiplier

    def overhead(self, p: BatchProfile) -> float:
        """Per-request pre + post processing charged against the SLO (ms)."""
        return (p.pre_ms + p.post_ms) * self.multiplier if self.overheads else 0.0

    def max_batch(self, p: BatchProfile, slo_ms: float, where: str | None = None) -> int:
        """Largest batch a GPU running only this model can use: worst case 2ℓ(b) (+ overheads) ≤ L.

        Scans b upward and stops at the first size that breaks the bound (code ``GetMaxBatch``).
        Raises ConfigError naming ``<where>.slo_ms`` (default the model) when even batch 1 cannot meet the SLO.
        """
        budget = (slo_ms - self.network_ms - self.overhead(p)) / 2.0
        best = 0
        for b in p.batches:
            if not fits(self.latency(p, b), budget):
                break
            best = b
        if best == 0:
            raise ConfigError(
                f"{where or p.model}.slo_ms", slo_ms,
                f"below what batch 1 of {p.model} needs ({2 * self.latency(p, 1) + self.network_ms + self.overhead(p):.3f} ms "
                f"= 2×ℓ(1) + overheads)")
        return best

    def residual(self, p: BatchProfile, slo_ms: float, rate: float, cap: int) -> tuple[int, float]:
        """Batch and duty cycle for a residual rate ``r`` < T: Eq. (2), largest b with b/r + ℓ(b) ≤ L.

        Returns ``(b, d_ms)``; ``b ≤ cap`` (the saturated max batch).
        """
        best, duty = 0, 0.0
        for b in p.batches:
            if b > cap:
                break
            gather = 1000.0 * ((b - 1) if self.residual_minus_one else b) / rate
            busy = self.latency(p, b) + self.overhead(p)
            if fits(gather + busy, slo_ms):
                best = b
                duty = min(slo_ms - busy, 1000.0 * b / rate) if self.residual_minus_one else 1000.0 * b / rate
        if best == 0:  # a tiny rate still runs batches of 1 within the SLO because 2ℓ(1) ≤ L
            best, duty = p.batches[0], slo_ms - self.latency(p, p.batches[0]) - self.overhead(p)
        if not fits(self.latency(p, best), duty):  # one GPU cannot keep up at this batch: run it like a saturated GPU
            best, duty = cap, self.latency(p, cap)
        return best, duty

    def worst_case(self, p: BatchProfile, duty_ms: float, b: int) -> float:
        """Worst-case latency of a request of a session running ``b`` per duty cycle ``d``: d + ℓ(b) (+ overheads)."""
        return duty_ms + self.latency(p, b) + self.overhead(p)


PAPER = Accounting("paper")
CODE = Accounting("code", add_std=True, overheads=True, network_ms=2.0, residual_minus_one=True)
PRESETS: dict[str, Accounting] = {"paper": PAPER, "code": CODE}


def serial_preprocess(profile: BatchProfile, preprocess_ms: float, threads: int = 1) -> BatchProfile:
    """The profile of a worker that pre-processes a batch on the CPU before its forward (no OL).

    Nexus §6.3/§7.3.1: without overlapping CPU and GPU work, "serializing preprocessing with GPU execution for
    each batch" makes a batch of ``b`` take ``ℓ'(b) = ⌈b/k⌉·p + ℓ(b)``: ``p`` ms per request on ``k`` CPU threads
    (default one per GPU worker: ``b·p + ℓ(b)``; inferred). The result is contiguous in ``b`` (a padded size still
    pre-processes only its ``b`` real inputs); std, memory and the code preset's pre/post overheads are the
    original's.
    """
    if not (math.isfinite(preprocess_ms) and preprocess_ms >= 0):
        raise ConfigError(f"{profile.model}.preprocess_ms", preprocess_ms, "must be a finite number >= 0")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError("preprocess_threads", threads, "must be an integer >= 1")
    if preprocess_ms == 0:
        return profile
    bs = tuple(range(1, profile.max_batch + 1))
    return BatchProfile(profile.model, bs, tuple(profile.latency(b) + -(-b // threads) * preprocess_ms for b in bs),
                        std_ms=tuple(profile.std(b) for b in bs) if profile.std_ms else (),
                        memory_bytes=tuple(profile.memory(b) for b in bs) if profile.memory_bytes else (),
                        pre_ms=profile.pre_ms, post_ms=profile.post_ms)


def load_published_profile(model: str) -> BatchProfile:
    """One of the TITAN X (Pascal) profiles shipped with the authors' code (``gpu/data/nexus``)."""
    if model not in _FILES:
        raise ConfigError("model", model, f"no published profile; choose one of {sorted(_FILES)}")
    root = resources.files(_DATA_PACKAGE)
    df = pd.read_csv(root.joinpath(_FILES[model] + ".csv").open())
    meta = json.loads(root.joinpath(_FILES[model] + ".json").read_text())
    pre, post = meta["preprocess_us"], meta["postprocess_us"]
    return BatchProfile(
        model=model,
        batches=tuple(int(b) for b in df["batch"]),
        latency_ms=tuple(float(v) / 1000.0 for v in df["latency_us"]),
        std_ms=tuple(float(v) / 1000.0 for v in df["std_us"]),
        memory_bytes=tuple(int(v) for v in df["memory_bytes"]),
        pre_ms=(pre["mean"] + pre["std"]) / 1000.0,
        post_ms=(post["mean"] + post["std"]) / 1000.0,
    )


def published_profiles() -> dict[str, BatchProfile]:
    """All four published profiles by model name."""
    return {m: load_published_profile(m) for m in PUBLISHED_MODELS}


def fit_linear(profile: BatchProfile, max_batch: int | None = None) -> LinearFit:
    """Least-squares fit of Eq. (1) over the profiled sizes ≤ ``max_batch`` (scipy ``linregress``)."""
    b = np.asarray(profile.batches, dtype=float)
    y = np.asarray(profile.latency_ms, dtype=float)
    keep = b <= (max_batch or profile.max_batch)
    if keep.sum() < 2:
        raise ConfigError("max_batch", max_batch, "need at least two profiled batch sizes to fit α and β")
    res = stats.linregress(b[keep], y[keep])
    return LinearFit(float(res.slope), float(res.intercept), float(res.rvalue**2))


def linear_profile(model: str, alpha_ms: float, beta_ms: float, max_batch: int,
                   memory_bytes: int = 0) -> BatchProfile:
    """A synthetic profile ℓ(b) = αb + β for b = 1..max_batch (the paper's anchors, ``nexus_synthetic``)."""
    if alpha_ms < 0 or beta_ms < 0 or alpha_ms + beta_ms <= 0:
        raise ConfigError(f"{model}.alpha_ms/beta_ms", (alpha_ms, beta_ms), "need α ≥ 0, β ≥ 0 and ℓ(1) > 0")
    if max_batch < 1:
        raise ConfigError(f"{model}.max_batch", max_batch, "must be >= 1")
    bs = tuple(range(1, int(max_batch) + 1))
    mem = tuple(int(memory_bytes) for _ in bs) if memory_bytes else ()
    return BatchProfile(model, bs, tuple(alpha_ms * b + beta_ms for b in bs), memory_bytes=mem)


def table_profile(model: str, latency_ms: Mapping[int, float]) -> BatchProfile:
    """A profile from a small ``{batch: latency_ms}`` table (e.g. the paper's Table 2)."""
    items = sorted((int(b), float(v)) for b, v in latency_ms.items())
    return BatchProfile(model, tuple(b for b, _ in items), tuple(v for _, v in items))


def profile_from_measurements(model: str, samples: Iterable[tuple[int, float]], *,
                              pre_ms: float = 0.0, post_ms: float = 0.0) -> BatchProfile:
    """Build a profile from measured ``(batch, latency_ms)`` pairs, as the Nexus profiler does.

    Repeats of a batch size are averaged (mean and std, like the profiler's 10 timed runs); sizes that
    were not measured between 1 and the largest measured one are filled from the least-squares line
    of Eq. (1), so the result is contiguous from 1 and any torch model can be profiled at a few sizes.
    """
    df = pd.DataFrame(list(samples), columns=["batch", "latency_ms"])
    if df.empty:
        raise ConfigError("samples", [], "need at least one (batch, latency_ms) pair")
    if (df["batch"] < 1).any() or (df["latency_ms"] <= 0).any():
        raise ConfigError("samples", df.to_dict("records")[:3], "batch must be >= 1 and latency > 0")
    g = df.groupby("batch")["latency_ms"].agg(["mean", "std"]).fillna(0.0)
    sizes = np.arange(1, int(g.index.max()) + 1)
    if len(g) >= 2:
        fit = stats.linregress(g.index.to_numpy(float), g["mean"].to_numpy())
        line = np.maximum(fit.slope * sizes + fit.intercept, 1e-6)
    else:
        line = np.full(len(sizes), float(g["mean"].iloc[0]))
    mean = pd.Series(line, index=sizes)
    mean.loc[g.index] = g["mean"]
    std = pd.Series(0.0, index=sizes)
    std.loc[g.index] = g["std"]
    return BatchProfile(model, tuple(int(b) for b in sizes), tuple(float(v) for v in mean),
                        std_ms=tuple(float(v) for v in std), pre_ms=pre_ms, post_ms=post_ms)
