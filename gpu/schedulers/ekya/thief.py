"""Ekya's thief scheduler: which streams retrain, with which config, on what GPU share.

Paper: Ekya (Bhardwaj et al., NSDI'22; thesis Chapter 2, §2.4): Eq. 2.1 (maximise the mean over
streams of inference accuracy averaged over the retraining window, subject to the GPU budget and a
minimum instantaneous accuracy ``a_MIN``), Algorithm 1 (thief scheduler), Algorithm 2
(PickConfigs) and EstimateAccuracy (§2.4, whose formula the paper does not give). Choices where the
paper is silent (docs/ekya.md lists them):

- EstimateAccuracy is a piecewise time average: the old model serves until retraining ends, the
  retrained model afterwards; a config that cannot finish in the window is infeasible.
- Inference accuracy = model accuracy x relative accuracy of the frame rate the allocation sustains
  (``InferenceProfile``).
- When no inference config meets ``a_MIN`` the stream is scored with the graded penalty
  ``penalty * (a_MIN - lowest instantaneous accuracy)`` instead of being dropped, so greedy stealing
  repairs it rather than starving it. a_MIN filters inference configs (frame rates), so it
  binds only while the serving model can reach it at full rate: for a model already below a_MIN
  no config qualifies and no allocation can remove the shortfall, and penalising it would drive
  GPUs into that stream's inference instead of into the retraining that lifts it.
- "No retraining" is always a candidate; a training share it leaves idle is stolen back.
- After a retraining completes its GPUs return to the stream's inference, in the estimate as in
  the simulator, so early completion is credited.
- Fair start = equal share per job (Algorithm 1 line 2); passes repeat until one brings no improvement
  ("repeats the process till the accuracy stops increasing", §2.4 "Thief Scheduler").
  ``EkyaParams(start_splits=True)`` additionally seeds the search with per-stream splits, an extension
  that is not Algorithm 1.
- Each job is capped at ``max_job_gpus`` (default one GPU: GPU fractions are "coarse fractions", §2.1);
  allocations are compared with a small tolerance.

Example::

    >>> a = StreamState("A", 0.65, (RetrainConfig("cfg2", 0.70, 65.0),))
    >>> thief_schedule([a], gpus=1.0, window_s=120.0).allocation()
    {'A/infer': 1.0}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from gpu.errors import ConfigError

_EPS = 1e-9


def infer_job(stream: str) -> str:
    """Job id of a stream's inference job (keys of ``EkyaDecision.allocation()``)."""
    return f"{stream}/infer"


def train_job(stream: str) -> str:
    """Job id of a stream's retraining job."""
    return f"{stream}/train"


def _unit(value: float, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(field, value, "must be a number between 0 and 1")
    return float(value)


@dataclass(frozen=True)
class RetrainConfig:
    """One retraining configuration gamma as the micro-profiler reports it.

    ``accuracy`` is the retrained model's accuracy at full frame rate on this window's data;
    ``gpu_seconds`` is the retraining duration with 100% of one GPU (paper's "GPU seconds").
    """

    name: str
    accuracy: float
    gpu_seconds: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("config.name", self.name, "must be a non-empty string")
        _unit(self.accuracy, f"configs[{self.name}].accuracy")
        g = self.gpu_seconds
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not g > 0 or math.isinf(g):
            raise ConfigError(f"configs[{self.name}].gpu_seconds", g, "must be a finite number > 0")


@dataclass(frozen=True)
class InferenceProfile:
    """Relative inference accuracy versus GPU share (the inference configs Lambda).

    An allocation of ``gpus`` sustains the frame rate ``min(1, gpus / full_rate_gpus)`` (frames are
    sub-sampled to keep up with the live stream); ``points`` maps that rate to the fraction of the
    model's accuracy kept (piecewise linear, from (0, 0) to (1, 1) by default).
    """

    full_rate_gpus: float = 1.0
    points: tuple[tuple[float, float], ...] = ((0.0, 0.0), (1.0, 1.0))

    def __post_init__(self) -> None:
        f = self.full_rate_gpus
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
            raise ConfigError("inference.full_rate_gpus", f, "must be a number > 0")
        pts = tuple((float(r), float(q)) for r, q in self.points)
        rates = [r for r, _ in pts]
        if len(pts) < 2 or rates[0] != 0.0 or rates[-1] != 1.0 or any(b <= a for a, b in zip(rates, rates[1:])):
            raise ConfigError("inference.points", self.points, "rates must rise strictly from 0 to 1")
        rel = [q for _, q in pts]
        if any(not 0.0 <= q <= 1.0 for q in rel) or any(b < a for a, b in zip(rel, rel[1:])):
            raise ConfigError("inference.points", self.points, "relative accuracies must be in [0, 1] and non-decreasing")
        object.__setattr__(self, "points", pts)

    def frame_rate(self, gpus: float) -> float:
        """Fraction of the live frame rate that ``gpus`` can process (the chosen config lambda)."""
        return min(1.0, max(0.0, gpus) / self.full_rate_gpus)

    def relative_accuracy(self, gpus: float) -> float:
        """Fraction of the model's accuracy kept at the frame rate ``gpus`` sustains."""
        xs, ys = zip(*self.points)
        return float(np.interp(self.frame_rate(gpus), xs, ys))


@dataclass(frozen=True)
class RunningRetrain:
    """A retraining already under way when the scheduler is re-invoked; it keeps its GPUs."""

    config: str
    accuracy: float
    remaining_s: float
    gpus: float  # held until completion, then returned to the stream's inference


@dataclass(frozen=True)
class StreamState:
    """What the scheduler knows about one video stream at a decision point.

    ``accuracy`` is the deployed model's accuracy at full frame rate on current data; ``configs``
    the (pruned) retraining configs to choose from (empty: no retraining job this time).
    """

    name: str
    accuracy: float
    configs: tuple[RetrainConfig, ...] = ()
    inference: InferenceProfile = InferenceProfile()
    running: RunningRetrain | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ConfigError("stream.name", self.name, "must be a non-empty string without '/'")
        _unit(self.accuracy, f"streams[{self.name}].accuracy")
        object.__setattr__(self, "configs", tuple(self.configs))
        names = [c.name for c in self.configs]
        if len(set(names)) != len(names):
            raise ConfigError(f"streams[{self.name}].configs", names, "config names must be unique")
        if self.running is not None and self.configs:
            raise ConfigError(f"streams[{self.name}].configs", names, "a stream that is retraining cannot start another")


@dataclass(frozen=True)
class EkyaParams:
    """Knobs of the thief scheduler (Delta = 0.1 GPU: "0.1 ... fraction of a GPU", §2.6; others docs/ekya.md)."""

    delta: float = 0.1  # steal quantum, GPUs
    a_min: float = 0.0  # minimum instantaneous inference accuracy
    penalty: float = 10.0  # weight of the a_MIN shortfall in the score
    max_job_gpus: float | None = 1.0  # per-job cap; None = no cap
    max_passes: int = 3  # thief passes
    retrain_scaling: float = 1.0  # alpha in throughput(x) = x**alpha for x GPUs
    start_splits: bool = False  # also try per-stream inference/retraining splits as starting points (not in Algorithm 1)

    def __post_init__(self) -> None:
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not self.delta > 0:
            raise ConfigError("delta", self.delta, "must be a number > 0")
        _unit(self.a_min, "a_min")
        if not isinstance(self.penalty, (int, float)) or self.penalty < 0:
            raise ConfigError("penalty", self.penalty, "must be a number >= 0")
        if self.max_job_gpus is not None and not (isinstance(self.max_job_gpus, (int, float)) and self.max_job_gpus >= self.delta):
            raise ConfigError("max_job_gpus", self.max_job_gpus, "must be >= delta (or null for no cap)")
        if not isinstance(self.max_passes, int) or self.max_passes < 1:
            raise ConfigError("max_passes", self.max_passes, "must be an integer >= 1")
        if not isinstance(self.retrain_scaling, (int, float)) or not 0 < self.retrain_scaling <= 1:
            raise ConfigError("retrain_scaling", self.retrain_scaling, "must be in (0, 1]")
        if not isinstance(self.start_splits, bool):
            raise ConfigError("start_splits", self.start_splits, "must be true or false")


@dataclass(frozen=True)
class StreamDecision:
    """One stream's share of a decision: retraining config (None = no retraining), GPUs, estimate."""

    stream: str
    config: str | None
    retrain_gpus: float
    infer_gpus: float
    frame_rate: float
    expected_accuracy: float  # window-averaged estimate (EstimateAccuracy)
    min_accuracy: float  # lowest instantaneous inference accuracy in the window
    retrain_s: float | None  # time until the retrained model is deployed (None: not retraining)
    score: float  # expected_accuracy minus the a_MIN penalty


@dataclass(frozen=True)
class EkyaDecision:
    """GPU shares and configs for every stream, plus the scheduler's accuracy estimate.

    ``allocation()`` looks like ``{"A/infer": 0.9, "A/train": 0.6, "B/infer": 1.5}`` (GPUs).
    """

    pool_gpus: float
    window_s: float
    streams: tuple[StreamDecision, ...]
    expected_accuracy: float
    score: float
    pick_calls: int = 0
    start: Mapping[str, float] | None = None  # thief: the allocation the search started from
    delta: float | None = None  # thief: steal quantum; allocation - start is a multiple of it

    def allocation(self) -> dict[str, float]:
        """Job id -> GPUs; a retraining job appears only when the stream retrains."""
        out: dict[str, float] = {}
        for s in self.streams:
            out[infer_job(s.stream)] = s.infer_gpus
            if s.config is not None and s.retrain_gpus > 0:
                out[train_job(s.stream)] = s.retrain_gpus
        return out

    def shares(self) -> dict[str, float]:
        """Job id -> fraction of the pool (what ``ekya_placement.to_gpu_requests`` takes)."""
        pool = self.pool_gpus if self.pool_gpus > 0 else 1.0
        return {job: g / pool for job, g in self.allocation().items()}

    def stream(self, name: str) -> StreamDecision:
        for s in self.streams:
            if s.stream == name:
                return s
        raise ConfigError("stream", name, "not in this decision")


def estimate_accuracy(stream: StreamState, config: RetrainConfig | None, infer_gpus: float, retrain_gpus: float,
                      window_s: float, params: EkyaParams) -> StreamDecision:
    """EstimateAccuracy (§3.3): window-averaged accuracy of one stream for one (gamma, lambda, R, I).

    The old model serves at the allocation's frame rate until retraining ends after
    ``gpu_seconds / retrain_gpus**alpha``; then the better of old and retrained model serves, and
    the stream's training GPUs return to its inference (the allocation a re-invoked thief starts
    from, so the estimate is a lower bound of what follows). With ``config=None`` a training share
    stays idle (the thief then steals it). ``retrain_s`` may exceed the window: such a
    config is infeasible for the thief.
    """
    q = stream.inference.relative_accuracy(infer_gpus)
    before = stream.accuracy
    if stream.running is not None:
        switch, after = stream.running.remaining_s, max(before, stream.running.accuracy)
        q_after = stream.inference.relative_accuracy(infer_gpus + stream.running.gpus)
    elif config is not None and retrain_gpus > _EPS:
        switch = config.gpu_seconds / retrain_gpus ** params.retrain_scaling
        after = max(before, config.accuracy)
        q_after = stream.inference.relative_accuracy(infer_gpus + retrain_gpus)
    else:
        switch, after, q_after = math.inf, before, q
    t = min(switch, window_s)
    accuracy = (t * before * q + (window_s - t) * after * q_after) / window_s
    lowest = min(before * q if t > 0 else math.inf, after * q_after if t < window_s else math.inf)
    shortfall = max(params.a_min - before * q if t > 0 and before >= params.a_min else 0.0,
                    params.a_min - after * q_after if t < window_s and after >= params.a_min else 0.0, 0.0)
    score = accuracy - params.penalty * shortfall
    retrain_s = switch if config is not None and retrain_gpus > _EPS else None
    return StreamDecision(stream.name, config.name if retrain_s is not None else None,
                          retrain_gpus if retrain_s is not None else 0.0, infer_gpus,
                          stream.inference.frame_rate(infer_gpus), accuracy, lowest, retrain_s, score)


def _choose(stream: StreamState, infer_gpus: float, retrain_gpus: float, window_s: float,
            params: EkyaParams) -> StreamDecision:
    """Lines 3-14 of Algorithm 2 for one stream: best feasible retraining config (None first)."""
    best = estimate_accuracy(stream, None, infer_gpus, retrain_gpus, window_s, params)
    if retrain_gpus <= _EPS:
        return best
    for cfg in stream.configs:
        cand = estimate_accuracy(stream, cfg, infer_gpus, retrain_gpus, window_s, params)
        if cand.retrain_s is not None and cand.retrain_s <= window_s + _EPS and cand.score > best.score + _EPS:
            best = cand
    return best


def _decision(streams: Sequence[StreamDecision], pool: float, window_s: float, calls: int) -> EkyaDecision:
    return EkyaDecision(pool, window_s, tuple(streams), float(np.mean([s.expected_accuracy for s in streams])),
                        float(np.mean([s.score for s in streams])), calls)


def pick_configs(streams: Sequence[StreamState], allocation: Mapping[str, float], gpus: float, window_s: float,
                 params: EkyaParams = EkyaParams()) -> EkyaDecision:
    """PickConfigs (Algorithm 2) for a fixed allocation (job id -> GPUs): best config per stream."""
    _check_inputs(streams, gpus, window_s)
    if sum(allocation.values()) > gpus + 1e-6:
        raise ConfigError("allocation", dict(allocation), f"uses more than the pool's {gpus} GPUs")
    chosen = [_choose(s, allocation.get(infer_job(s.name), 0.0), allocation.get(train_job(s.name), 0.0),
                      window_s, params) for s in streams]
    return _decision(chosen, gpus, window_s, 1)


def _check_inputs(streams: Sequence[StreamState], gpus: float, window_s: float) -> None:
    if not streams:
        raise ConfigError("streams", [], "at least one stream is required")
    names = [s.name for s in streams]
    if len(set(names)) != len(names):
        raise ConfigError("streams", names, "stream names must be unique")
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0:
        raise ConfigError("gpus", gpus, "must be a number >= 0")
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not window_s > 0:
        raise ConfigError("window_s", window_s, "must be a number > 0")


def fair_allocation(n_jobs: int, gpus: float, max_job_gpus: float | None) -> float:
    """Equal share per job (Algorithm 1 line 2), capped at ``max_job_gpus``."""
    share = gpus / n_jobs if n_jobs else 0.0
    return share if max_job_gpus is None else min(share, max_job_gpus)


def _job_ids(streams: Sequence[StreamState], jobs: list[tuple[int, str]]) -> list[str]:
    return [infer_job(streams[i].name) if kind == "infer" else train_job(streams[i].name) for i, kind in jobs]


START_SPLITS = tuple(k / 10 for k in range(1, 10))  # inference shares of the extra starting points


def _start(streams: Sequence[StreamState], jobs: list[tuple[int, str]], gpus: float, params: EkyaParams,
           start: Mapping[str, float] | None) -> list[list[float]]:
    """Candidate initial GPUs per job: ``start`` if given, else the fair allocation (Algorithm 1 line 2).

    With ``params.start_splits`` (an extension, not Algorithm 1) each stream's ``gpus/|V|`` split
    10/90 ... 90/10 between inference and retraining is tried as well (one PickConfigs call each) and
    the best candidate seeds the search, the fair one winning ties: when a fair share is below Delta no
    job can be a victim and Algorithm 1 stays at the fair start. The splits are finer than a coarse
    Delta, so they hide most of the Delta effect.
    """
    cap = math.inf if params.max_job_gpus is None else params.max_job_gpus
    ids = _job_ids(streams, jobs)
    if start is not None:
        unknown = sorted(set(start) - set(ids))
        if unknown:
            raise ConfigError("start", unknown, f"not jobs of this invocation (jobs: {ids})")
        if any(not v >= -1e-6 for v in start.values()) or sum(start.values()) > gpus + 1e-6:
            raise ConfigError("start", dict(start), f"needs GPUs >= 0 that add up to at most {gpus}")
        return [[min(cap, max(0.0, float(start.get(job, 0.0)))) for job in ids]]
    candidates = [[fair_allocation(len(jobs), gpus, params.max_job_gpus)] * len(jobs)]
    if not params.start_splits:
        return candidates
    has_train = {i for i, kind in jobs if kind == "train"}
    per_stream = gpus / len(streams)
    for share in START_SPLITS:
        candidates.append([min(cap, per_stream * (1.0 if i not in has_train else share if kind == "infer" else 1 - share))
                           for i, kind in jobs])
    return candidates


def thief_schedule(streams: Sequence[StreamState], gpus: float, window_s: float,
                   params: EkyaParams = EkyaParams(), start: Mapping[str, float] | None = None) -> EkyaDecision:
    """Algorithm 1: start fair, let every job steal Delta from every other while accuracy improves.

    Args:
        streams: every stream's state; streams with configs and no running retraining get a
            retraining job, every stream gets an inference job.
        gpus: GPUs this invocation may hand out (the pool minus running retraining jobs).
        window_s: remaining length of the retraining window (seconds).
        params: Delta, a_MIN and the other knobs.
        start: initial allocation (job id -> GPUs) instead of the fair one, e.g. on a re-invocation
            the current allocation with the freed GPUs added (values above the cap are clipped).

    Returns:
        The best allocation found (fair share + whole steps of Delta, never above ``gpus``) with
        its configs. As in Algorithm 1 a victim cannot go below 0, so a fair share smaller than
        Delta can only grow.
    """
    _check_inputs(streams, gpus, window_s)
    d, cap = params.delta, (math.inf if params.max_job_gpus is None else params.max_job_gpus)
    jobs = [(i, "infer") for i in range(len(streams))]
    jobs += [(i, "train") for i, s in enumerate(streams) if s.configs and s.running is None]
    train_slot = {i: j for j, (i, kind) in enumerate(jobs) if kind == "train"}
    bases = _start(streams, jobs, gpus, params, start)
    base = bases[0]  # read by per_stream; set to each candidate start in turn
    cache: dict[tuple[int, int, int], StreamDecision] = {}
    calls = 0

    def per_stream(steps: list[int]) -> list[StreamDecision]:
        out = []
        for i, s in enumerate(streams):
            key = (i, steps[i], steps[train_slot[i]] if i in train_slot else None)
            if key not in cache:
                # a job stolen down to nothing is 0, not the -1e-17 that base + k * Delta can round to
                retrain = 0.0 if key[2] is None else max(0.0, base[train_slot[i]] + key[2] * d)
                cache[key] = _choose(s, max(0.0, base[i] + key[1] * d), retrain, window_s, params)
            out.append(cache[key])
        return out

    def score(steps: list[int]) -> float:
        nonlocal calls
        calls += 1
        return float(np.mean([c.score for c in per_stream(steps)]))

    def start_score(candidate: list[float]) -> float:
        nonlocal base
        base = candidate
        cache.clear()
        return score([0] * len(jobs))

    base = max(bases, key=start_score)  # the first (fair) start wins ties
    cache.clear()
    best = [0] * len(jobs)  # allocation of job j = base[j] + best[j] * Delta
    best_score = score(best)
    for _ in range(params.max_passes):
        improved = False
        for thief in range(len(jobs)):
            for victim in range(len(jobs)):
                if thief == victim:
                    continue
                temp = list(best)
                while True:
                    temp[victim] -= 1
                    temp[thief] += 1
                    if base[victim] + temp[victim] * d < -_EPS or base[thief] + temp[thief] * d > cap + _EPS:
                        break
                    s = score(temp)
                    if s > best_score + _EPS:
                        best, best_score, improved = list(temp), s, True
                    else:
                        break
        if not improved:
            break
    start_alloc = {job: b for job, b in zip(_job_ids(streams, jobs), base)}
    return replace(_decision(per_stream(best), gpus, window_s, calls), start=start_alloc, delta=d)
