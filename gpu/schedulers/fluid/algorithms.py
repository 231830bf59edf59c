"""FLUID: how wide each trial of a TrialGroup runs (Yu, PhD thesis 2022, Ch. 3 = MLSys'21).

* ``static_fluid`` — Algorithm 3.1 (StaticFluid): water-filling widths for a new TrialGroup on idle GPUs,
  ``w_i = min(max(floor(h_i1 / sum_j h_j1 * n), 1/c), d)``.
* ``dynamic_fluid`` — Algorithm 3.2 (DynamicFluid): the same formula over the group's resources when GPUs
  free up, applied only when it does not hurt (scale up if faster by more than ``epsilon``; scale down if the
  resource-time ``w * h`` does not grow).
* ``runtime`` — Eq. 3.2, the runtime model ``h_{i,w}`` with packing overhead ``alpha`` and scaling
  overhead ``beta``.
* ``fit_packing_curve`` — Eq. 3.1: marginal packing benefit ``O^p`` from a measured packing curve, the fitted
  ``alpha`` and the packing limit ``c`` (largest p with ``O^p > O_th``; the thesis gives no ``O_th``).
* ``save_packing_curve``/``load_packing_curve`` — the last measured curve per device in the state folder, so a
  flow can take ``c`` from the benchmark's measurement instead of re-measuring.
* ``fit_scaling`` — ``t1`` and ``beta`` of Eq. 3.2 from iteration times measured at several widths (§3.5);
  ``max_parallelism`` — ``d`` from ``beta`` (largest width that still speeds a trial up).
* ``lower_bound``/``theorem1_bound``/``theorem2_bound`` — Theorem 1 (in its provable additive form) and
  Theorem 2 / Eq. 3.3, used by tests and the benchmark to check StaticFluid on random instances.

Widths: a width < 1 is a fraction of one GPU shared with other trials (always ``1/c``), a width >= 1 is a whole
number of GPUs for distributed training. Placement onto concrete GPUs is ``gpu.schedulers.fluid.controller``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import curve_fit

from gpu.errors import ConfigError
from gpu.scenario import MAX_FACTOR, MAX_GPUS, MAX_SECONDS
from gpu.state import state_dir

_TOL = 1e-9

MAX_PACKED = 1_024  # trials packed on one GPU (c): one process each


@dataclass(frozen=True)
class Trial:
    """One training trial of a TrialGroup: a configuration and the iterations it must still run.

    Args:
        trial_id: unique id (the tuning algorithm's run id, e.g. ``"c0003@1"``).
        budget: iterations to train in this group (> 0).
        config: the hyperparameters (copied at construction).
        iter_time_s: ``t_1``, seconds per iteration on one whole GPU (profiled, §3.5).
        alpha: packing overhead (Eq. 3.2), >= 1.
        beta: scaling overhead (Eq. 3.2), >= 1.
        resume_from: iterations already trained (checkpoint the trial resumes from).
        checkpoint: trial id whose checkpoint this trial loads (promotion, PBT exploit), or None.
    """

    trial_id: str
    budget: float
    config: Mapping[str, Any] = field(default_factory=dict, compare=False)
    iter_time_s: float = 1.0
    alpha: float = 1.0
    beta: float = 1.0
    resume_from: float = 0.0
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        if not self.trial_id:
            raise ConfigError("trial_id", self.trial_id, "must be a non-empty string")
        if not self.budget > 0:
            raise ConfigError("budget", self.budget, f"trial {self.trial_id}: must be > 0 iterations")
        if not self.iter_time_s > 0:
            raise ConfigError("iter_time_s", self.iter_time_s, f"trial {self.trial_id}: must be > 0 seconds")
        if not self.alpha >= 1:
            raise ConfigError("alpha", self.alpha, f"trial {self.trial_id}: packing overhead must be >= 1")
        if not self.beta >= 1:
            raise ConfigError("beta", self.beta, f"trial {self.trial_id}: scaling overhead must be >= 1")
        if self.resume_from < 0:
            raise ConfigError("resume_from", self.resume_from, f"trial {self.trial_id}: must be >= 0")
        object.__setattr__(self, "config", dict(self.config))  # a private copy; stays picklable for task runners

    @property
    def h1(self) -> float:
        """``h_{i,1}``: runtime of the whole budget on one GPU (Eq. 3.2 at w = 1)."""
        return self.budget * self.iter_time_s


@dataclass(frozen=True)
class TrialGroup:
    """The unit FLUID schedules (§3.3.2): trials submitted together whose makespan is minimised."""

    group_id: str
    trials: tuple[Trial, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "trials", tuple(self.trials))
        if not self.trials:
            raise ConfigError("trials", [], f"group {self.group_id}: a TrialGroup needs at least one trial")
        ids = [t.trial_id for t in self.trials]
        if len(set(ids)) != len(ids):
            raise ConfigError("trial_id", ids, f"group {self.group_id}: trial ids must be unique")


@dataclass(frozen=True)
class FluidParams:
    """FLUID's knobs: packing limit ``c``, parallelism limit ``d``, resize overhead ``epsilon`` (seconds)."""

    c: int = 2
    d: int = 1
    epsilon: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.c, bool) or not isinstance(self.c, (int, np.integer)) or not 1 <= self.c <= MAX_PACKED:
            raise ConfigError("c", self.c, f"packing limit must be an integer from 1 to {MAX_PACKED} trials per GPU")
        if isinstance(self.d, bool) or not isinstance(self.d, (int, np.integer)) or not 1 <= self.d <= MAX_GPUS:
            raise ConfigError("d", self.d, f"parallelism limit must be an integer from 1 to {MAX_GPUS:,} GPUs")
        if not 0 <= self.epsilon <= MAX_SECONDS:
            raise ConfigError("epsilon", self.epsilon, f"resize overhead must be 0 to {MAX_SECONDS:,.0f} seconds")


def runtime(h1: float, width: float, alpha: float = 1.0, beta: float = 1.0) -> float:
    """Eq. 3.2: ``h_{i,w}`` = ``h1 * alpha**(1/w - 1)`` for w in (0, 1), ``h1 / w * beta**(w - 1)`` for w >= 1."""
    if not width > 0:
        raise ConfigError("width", width, "must be > 0")
    if width < 1:
        return h1 * alpha ** (1.0 / width - 1.0)
    return h1 / width * beta ** (width - 1.0)


def _width(share: float, n: int, params: FluidParams) -> float:
    """Line 3 of Algorithms 3.1/3.2 for one trial with ``share = h_i1 / sum_j h_j1``."""
    return float(min(max(math.floor(share * n + _TOL), 1.0 / params.c), params.d))


@dataclass(frozen=True)
class StaticPlan:
    """Algorithm 3.1's decision: widths in non-increasing ``h_{i,1}`` order, e.g. ``(("a4", 3.0), ("a1", 0.5))``."""

    widths: tuple[tuple[str, float], ...]

    def width(self, trial_id: str) -> float:
        return dict(self.widths)[trial_id]


def static_fluid(trials: Sequence[Trial], n: int, params: FluidParams) -> StaticPlan:
    """Algorithm 3.1 (StaticFluid): widths for a new TrialGroup on ``n`` idle GPUs (``n = |M'|``, Alg. 3.1 line 1)."""
    if not trials:
        raise ConfigError("trials", [], "StaticFluid needs at least one trial")
    if n < 0:
        raise ConfigError("n", n, "idle GPUs must be >= 0")
    order = sorted(trials, key=lambda t: -t.h1)
    total = sum(t.h1 for t in order)
    return StaticPlan(tuple((t.trial_id, _width(t.h1 / total, n, params)) for t in order))


@dataclass(frozen=True)
class RunningTrial:
    """What DynamicFluid knows about a running trial: remaining ``h_{i,1}`` and current width."""

    trial_id: str
    h1_remaining: float
    width: float
    alpha: float = 1.0
    beta: float = 1.0


@dataclass(frozen=True)
class Resize:
    """DynamicFluid's decision for one trial, applied at the end of its current iteration."""

    trial_id: str
    old_width: float
    new_width: float

    @property
    def is_scale_up(self) -> bool:
        return self.new_width > self.old_width


def dynamic_fluid(running: Sequence[RunningTrial], n: int, params: FluidParams) -> tuple[Resize, ...]:
    """Algorithm 3.2 (DynamicFluid): resizes over the group's ``n`` GPUs (idle + committed).

    Lines 5/7 read "update to ``w'_i``". Only widths that change are returned, in non-increasing
    ``h_{i,1}`` order; the caller applies scale-downs before scale-ups so freed GPUs can be reused.
    """
    live = [r for r in running if r.h1_remaining > 0]
    total = sum(r.h1_remaining for r in live)
    decisions = []
    for r in sorted(live, key=lambda r: -r.h1_remaining):
        new = _width(r.h1_remaining / total, n, params)
        h_old = runtime(r.h1_remaining, r.width, r.alpha, r.beta)
        h_new = runtime(r.h1_remaining, new, r.alpha, r.beta)
        if new > r.width and h_new + params.epsilon < h_old:
            decisions.append(Resize(r.trial_id, r.width, new))
        elif new < r.width and new * (h_new + params.epsilon) < r.width * h_old:
            decisions.append(Resize(r.trial_id, r.width, new))
    return tuple(decisions)


@dataclass(frozen=True)
class PackingCurve:
    """Eq. 3.1 on a measured curve: fitted ``alpha``, ``t1`` and the packing limit ``c``."""

    ps: tuple[int, ...]
    throughputs: tuple[float, ...]
    marginal_benefit: tuple[float, ...]  # measured O^p for ps[1:], Eq. 3.1
    alpha: float
    t1: float
    c: int
    o_th: float


def packing_limit(alpha: float, o_th: float = 0.05, p_max: int = 64) -> int:
    """Largest p (<= p_max) with model ``O^q = 1 - alpha (q-1)/q > o_th`` for every 2 <= q <= p.

    Eq. 3.1 with the packing model of Eq. 3.2, ``T^p = t1 alpha^(p-1)``.
    """
    if not 1 <= alpha <= MAX_FACTOR:
        raise ConfigError("alpha", alpha, f"packing overhead must be from 1 to {MAX_FACTOR:,.0f}")
    if not 0 <= o_th < 1:
        raise ConfigError("o_th", o_th, "threshold must be in [0, 1)")
    c = 1
    for p in range(2, p_max + 1):
        if 1.0 - alpha * (p - 1) / p <= o_th:
            break
        c = p
    return c


def fit_packing_curve(ps: Sequence[int], throughputs: Sequence[float], o_th: float = 0.05) -> PackingCurve:
    """Fit ``avg(T^p) = t1 * alpha**(p-1)`` to a measured packing curve and derive ``c`` (Eq. 3.1, G1).

    Args:
        ps: numbers of identical trials packed on one device (must include 1, distinct, >= 2 points).
        throughputs: aggregate iterations/s of all p trials together (per-trial time is ``p / throughput``).
        o_th: marginal-benefit threshold ``O_th`` (not given in the thesis; default 0.05).

    Returns:
        PackingCurve with the measured ``O^p``, the least-squares ``alpha >= 1`` (scipy ``curve_fit`` in log
        space) and ``c = packing_limit(alpha, o_th)`` capped at the largest measured p.
    """
    p = np.asarray(ps, dtype=float)
    x = np.asarray(throughputs, dtype=float)
    if p.size < 2 or p.size != x.size:
        raise ConfigError("ps", list(ps), "need >= 2 packing levels and one throughput per level")
    if np.any(p < 1) or np.any(p != np.round(p)) or len(set(p)) != p.size or 1 not in p:
        raise ConfigError("ps", list(ps), "must be distinct integers >= 1 including 1")
    if np.any(~(x > 0)):
        raise ConfigError("throughputs", list(throughputs), "must all be > 0 iterations/s")
    order = np.argsort(p)
    p, x = p[order], x[order]
    per_trial = p / x  # avg(T^p): seconds per iteration of each of the p trials
    (log_t1, log_alpha), _ = curve_fit(
        lambda q, a, b: a + (q - 1) * b, p, np.log(per_trial), p0=(np.log(per_trial[0]), 0.0),
        bounds=([-np.inf, 0.0], [np.inf, np.inf]),
    )
    alpha = float(np.exp(log_alpha))
    ratios = per_trial[1:] / per_trial[:-1]
    benefit = 1.0 - (p[1:] - 1) / p[1:] * ratios  # Eq. 3.1 (consecutive measured levels)
    c = min(packing_limit(alpha, o_th), int(p[-1]))
    return PackingCurve(tuple(int(v) for v in p), tuple(float(v) for v in x), tuple(float(v) for v in benefit),
                        alpha, float(np.exp(log_t1)), c, o_th)


def packing_curve_path(device: str) -> Path:
    """``<state dir>/fluid/packing-<device>.json``: one file per device model (e.g. ``cpu``, a GPU's name)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    if not slug:
        raise ConfigError("device", device, "needs a name to key its packing curve")
    return state_dir() / "fluid" / f"packing-{slug}.json"


def save_packing_curve(curve: PackingCurve, device: str, **meta: object) -> Path:
    """Store a measured curve (levels, throughputs, ``O_th``, plus ``meta``) as the device's latest."""
    path = packing_curve_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "ps": list(curve.ps), "throughputs": list(curve.throughputs),
                                "o_th": curve.o_th, **meta}, indent=2, default=str))
    return path


def load_packing_curve(device: str) -> PackingCurve | None:
    """The device's last saved curve, re-fitted (so ``alpha``/``c`` follow this code); None when none was saved."""
    path = packing_curve_path(device)
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return fit_packing_curve(raw["ps"], raw["throughputs"], raw.get("o_th", 0.05))


def max_parallelism(beta: float, n: int, min_gain: float = 0.0) -> int:
    """``d`` from a scaling overhead: the largest ``w <= n`` whose every step up cuts ``h`` by more than ``min_gain``.

    ``h_w / h_{w-1} = beta (w-1) / w`` (Eq. 3.2), so ``w`` qualifies while ``w < beta / (beta - 1 + min_gain)``.
    With ``min_gain = 0`` any speed-up counts; a measured ``beta`` wants the same margin as the packing threshold
    ``O_th`` (a 2 % "gain" between two timings is noise, not a reason to spread a trial over two GPUs).
    """
    if not beta >= 1:
        raise ConfigError("beta", beta, "scaling overhead must be >= 1")
    if n < 1:
        raise ConfigError("n", n, "need at least one GPU")
    if not 0 <= min_gain < 1:
        raise ConfigError("min_gain", min_gain, "must be in [0, 1)")
    if beta - 1.0 + min_gain <= 0:
        return n
    limit = beta / (beta - 1.0 + min_gain)
    return int(max(1, min(n, math.ceil(limit) - 1)))


@dataclass(frozen=True)
class ScalingCurve:
    """Eq. 3.2 fitted to measured seconds per iteration at several widths: ``h_w = t1 / w * beta**(w - 1)``."""

    widths: tuple[int, ...]
    iter_times: tuple[float, ...]
    t1: float
    beta: float


def fit_scaling(widths: Sequence[int], iter_times: Sequence[float]) -> ScalingCurve:
    """Least-squares ``t1`` and ``beta >= 1`` from iteration times measured at whole-GPU widths (§3.5: measured).

    In log space ``log h_w + log w = log t1 + (w - 1) log beta`` is a line (numpy ``polyfit``); when its slope
    comes out negative (superlinear scaling, outside Eq. 3.2) the bounded optimum is ``beta = 1``.
    A trial that does not speed up at all (``h_2 = h_1``) fits ``beta = 2``: ``d = 1``.
    """
    w = np.asarray(widths, dtype=float)
    h = np.asarray(iter_times, dtype=float)
    if w.size < 2 or w.size != h.size:
        raise ConfigError("widths", list(widths), "need >= 2 widths and one iteration time per width")
    if np.any(w < 1) or np.any(w != np.round(w)) or len(set(w)) != w.size or 1 not in w:
        raise ConfigError("widths", list(widths), "must be distinct whole numbers of GPUs including 1")
    if np.any(~(h > 0)):
        raise ConfigError("iter_times", list(iter_times), "must all be > 0 seconds")
    order = np.argsort(w)
    w, h = w[order], h[order]
    y = np.log(h * w)
    log_beta, log_t1 = np.polyfit(w - 1, y, 1)
    if log_beta < 0:
        log_beta, log_t1 = 0.0, float(np.mean(y))
    return ScalingCurve(tuple(int(v) for v in w), tuple(float(v) for v in h), float(np.exp(log_t1)),
                        float(np.exp(log_beta)))


def lower_bound(trials: Sequence[Trial], n: int, d: int) -> float:
    """The OPT lower bound: ``max(sum h_i1 / n, max_i min_{1<=w<=min(d,n)} h_{i,w})`` (thesis appendix, Theorem 1)."""
    best_single = max(min(runtime(t.h1, w, t.alpha, t.beta) for w in range(1, min(d, n) + 1)) for t in trials)
    return max(sum(t.h1 for t in trials) / n, best_single)


def theorem1_bound(trials: Sequence[Trial], n: int, d: int) -> float:
    """Theorem 1 in its provable additive form: ``2 OPT + max h_1``, with OPT -> lower bound."""
    return 2.0 * lower_bound(trials, n, d) + max(t.h1 for t in trials)


def _power_limit(x: float, exponent_offset: float) -> float:
    """``x ** (1/(x-1) + offset)``, continuous at x = 1 where ``x ** (1/(x-1)) -> e``."""
    base = math.e if x == 1 else math.exp(math.log(x) / (x - 1.0))
    return base * x**exponent_offset


def theorem2_bound(trials: Sequence[Trial], n: int, d: int) -> float:
    """Eq. 3.3: ``max(2 OPT + max(h_1) alpha^(1/(alpha-1)), 2 OPT beta^(1/(beta-1)-1))`` with OPT -> lower bound."""
    opt = lower_bound(trials, n, d)
    alpha = max(t.alpha for t in trials)
    beta = max(t.beta for t in trials)
    return max(2 * opt + max(t.h1 for t in trials) * _power_limit(alpha, 0.0), 2 * opt * _power_limit(beta, -1.0))
