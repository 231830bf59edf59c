"""The real jobs that share the pool in the Cilantro allocation-rounds flow (thesis ch. 3 §3.7), and what they
measure.

Two kinds of job, each run once per round as a Prefect task on the GPU slice its allocation bought
(``with gpu_options(gpus=a_j)``; the task reads its slice from ``current_placement()``):

* **inference service** (``kind="service"``) — a torch MLP (``hidden`` units) trained on scikit-learn's digits
  answers requests; a request is a page of ``rows`` digit images to classify. Requests arrive as a Poisson
  process whose rate replays the Cilantro Twitter trace (``gpu/data/cilantro/twitter_1476_data``, via
  ``gpu.sim.cilantro.workloads``), scaled so the trace median is ``base_load`` requests/s, advancing
  ``trace_step`` trace values per report (time compression). Performance = the fraction of requests answered
  within ``latency_slo_ms`` (the paper's latency SLO attainment).
* **training job** (``kind="training"``) — an MLP of the same shape trained with Adam on minibatches of
  ``rows`` digits, resumed from the previous round's checkpoint. Performance = steps/s (throughput).

**Everything reported is measured.** Each request is really classified and each step really taken, inside
``tasks.runtime.slices.on_slice``, which turns the measured work into time on the task's slice (on a real GPU the
synchronised wall time the slice delivered, contention included; on a simulated pool the thread's CPU time
divided by the share). A round is ``round_s`` seconds of the slice's own clock (``SliceTimeline``): a
request starts when it has arrived and the slice is free, and holds it for its measured slice time
(one server per device of the placement); a request that cannot be answered before the round ends misses
the SLO (and is dropped unserved if it cannot even start); a trainer takes steps back to back until the
round is over. So make the model wider or a request bigger and the job reports lower attainment or fewer
steps at the same allocation: nothing in the reports comes from a formula or a configured cost. One round
costs about ``round_s`` × the pool's busy fraction of real compute time.

Each task reports per report period ``(load, perf, σ)`` for the learners — σ = ``0.5/√N`` for a fraction of
``N`` requests (the largest binomial standard error, as in ``gpu.sim.cilantro.run``), and for steps/s the larger
of one step per report and the spread of the measured step times — plus the performance the same arrivals
would have had on the fair share ``R/n`` (the denominator of F_NJC, eq. 3.3). That counterfactual is not run:
it replays the round's measured per-request work (full-device seconds = slice time × share, exact on a
simulated pool) on a fair-share timeline.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
from prefect import task

from gpu.errors import ConfigError
from gpu.scenario import MAX_COUNT, MAX_FACTOR, MAX_MS, MAX_RATE, integer, positive
from gpu.sim.cilantro.workloads import TRACE_MEDIAN, load_trace
from tasks.digits import digits_tensors, mlp
from tasks.runtime.requests import TaskPlacement, current_placement
from tasks.runtime.slices import on_slice

KINDS = ("service", "training")
_TRAIN_ROWS = 1200  # digits rows used for training; the remaining 597 are the requests' images
_REQUEST_ROWS = 1797 - _TRAIN_ROWS


@dataclass(frozen=True)
class JobConfig:
    """One job sharing the pool.

    Args:
        name: unique job name (MLflow metric names use it).
        kind: "service" (SLO on the fraction of requests within ``latency_slo_ms``) or "training"
            (SLO on steps/s).
        slo: target of the performance metric (a fraction in (0, 1] or steps/s); None = no SLO.
        utility: "linear", "quadratic" or "sqrt" (``min(1, p/SLO)^k``).
        weight: the job's entitlement weight.
        scale_ms: the a-priori full-GPU milliseconds of one request (service) or step (training). It only
            sizes the job's learner (its domain and slope bound, as the paper's profiles give ``int_ub`` and
            ``L``); what the job reports is measured from its real work.
        base_load: requests/s at the trace median (service).
        latency_slo_ms: latency bound of a request (service).
        trace_offset: where in the trace this service starts.
        hidden: hidden units of the job's MLP (the real work per image).
        rows: digit images per request (service) or per training minibatch (at most 597).
    """

    name: str
    kind: str
    slo: float | None
    utility: str = "linear"
    weight: float = 1.0
    scale_ms: float = 0.6
    base_load: float = 400.0
    latency_slo_ms: float = 20.0
    trace_offset: int = 0
    hidden: int = 1024
    rows: int = 256

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"{self.name}.kind", self.kind, f"unknown; choose one of {list(KINDS)}")
        for field, top in (("scale_ms", MAX_MS), ("base_load", MAX_RATE), ("latency_slo_ms", MAX_MS),
                           ("weight", MAX_FACTOR)):
            positive(getattr(self, field), f"{self.name}.{field}", upper=top)
        if self.slo is not None:
            positive(self.slo, f"{self.name}.slo", upper=MAX_RATE)
        integer(self.trace_offset, f"{self.name}.trace_offset", minimum=0, maximum=MAX_COUNT)
        for field, top in (("hidden", 65536), ("rows", _REQUEST_ROWS)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ConfigError(f"{self.name}.{field}", value, f"must be a whole number in [1, {top}]")
        if self.kind == "service" and self.slo is not None and not 0 < self.slo <= 1:
            raise ConfigError(f"{self.name}.slo", self.slo, "a service's SLO is a fraction of requests in (0, 1]")

    @property
    def scale_s(self) -> float:
        return self.scale_ms / 1000.0

    @property
    def learner_upper(self) -> float:
        """Right end of a service learner's input ``x = a/ℓ``: at ``4·scale`` GPU per req/s the slice is busy a
        quarter of the time and attainment is flat (training, ℓ ≡ 1, saturates nowhere: the flow uses R)."""
        return 4.0 * self.scale_s

    @property
    def lipschitz(self) -> float:
        """Slope bound of perf vs ``x``: attainment rises 0 → 1 about where the slice's busy fraction falls
        from 1 to 1/2 (``x ∈ [w, 2w]`` for work ``w`` per request), so 2/scale; steps/s is linear with slope
        1/w, bounded by 1.5/scale while the real step takes at least 2/3 of ``scale_ms``."""
        return 2.0 / self.scale_s if self.kind == "service" else 1.5 / self.scale_s


@dataclass(frozen=True)
class RoundWindow:
    """The round every job runs in: its index, length and report period (seconds of the slice's clock),
    the fair share R/n, the trace compression and the seed."""

    round_index: int
    round_s: float
    report_s: float
    fair_share: float
    trace_step: int = 1
    seed: int = 0

    @property
    def reports(self) -> int:
        return max(1, int(round(self.round_s / self.report_s)))


def slice_size(placement: TaskPlacement | None) -> float:
    """GPU units the task holds: the fraction of each of its devices times their number."""
    if placement is None or not placement.gpu_indices:
        return 0.0
    return float(placement.fraction) * len(placement.gpu_indices)


class SliceTimeline:
    """One round on a slice's clock: ``devices`` servers, each a share of one device, FIFO.

    ``run(arrival, work)`` starts a piece of work when it has arrived and a server is free, and calls
    ``work()`` for its measured duration on the slice (at least 1 µs: a clock tick); it returns the completion
    time, or None when the round ends first (``work`` is not called when the piece cannot even start).
    """

    def __init__(self, devices: int, end: float):
        self.free = [0.0] * max(0, devices)  # a heap of the servers' next free times
        self.end = end

    def run(self, arrival: float, work: Callable[[], float]) -> float | None:
        if not self.free:
            return None
        start = max(arrival, self.free[0])
        if start >= self.end:
            return None
        done = start + max(work(), 1e-6)
        heapq.heapreplace(self.free, done)
        return done if done <= self.end else None


def _job_rng(window: RoundWindow, job: JobConfig, stream: int) -> np.random.Generator:
    key = [window.seed, window.round_index, stream] + [ord(c) for c in job.name]
    return np.random.default_rng(key)


def service_loads(job: JobConfig, window: RoundWindow) -> np.ndarray:
    """Mean request rate (req/s) of each report: the trace, ping-pong replayed, median → ``base_load``."""
    trace = load_trace()
    pingpong = np.concatenate([trace, trace[::-1]])
    first = window.round_index * window.reports
    idx = (job.trace_offset + (first + np.arange(window.reports)) * window.trace_step) % len(pingpong)
    return pingpong[idx] * job.base_load / TRACE_MEDIAN


def arrivals(job: JobConfig, window: RoundWindow) -> list[np.ndarray]:
    """Poisson arrival times (seconds since the round start), one array per report."""
    rng = _job_rng(window, job, 2)
    out = []
    for k, rate in enumerate(service_loads(job, window)):
        n = rng.poisson(rate * window.report_s)
        out.append(np.sort(k * window.report_s + rng.uniform(0.0, window.report_s, n)))
    return out


def attainment(latencies: list[np.ndarray], job: JobConfig) -> np.ndarray:
    """Per report: fraction of requests answered within the latency SLO (1 when no request came)."""
    bound = job.latency_slo_ms / 1000.0
    return np.array([float(np.mean(lat <= bound)) if len(lat) else 1.0 for lat in latencies])


def _fair_slices(window: RoundWindow) -> tuple[int, float]:
    """The fair share R/n as devices × share of each: a fraction of one device, or whole devices."""
    return max(1, math.floor(window.fair_share + 1e-9)), min(1.0, window.fair_share)


def _torch():
    """torch with one intra-op thread: jobs sharing a CPU with more threads spin against each other, and
    ``on_slice`` measures the calling thread's CPU time on a simulated pool."""
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    return torch


@lru_cache(maxsize=8)
def _classifier(hidden: int, device: str):
    """A service's classifier, trained once per worker (200 Adam steps on the training rows)."""
    import torch

    xs, ys = digits_tensors(device)
    model = mlp(hidden, 0, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        idx = torch.randint(0, _TRAIN_ROWS, (64,), generator=gen).to(device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
        opt.step()
    return model.eval()


def service_model(job: JobConfig, device: str):
    """The model a service answers its requests with."""
    return _classifier(job.hidden, device)


@task(name="cilantro-service")
def run_service(job: JobConfig, window: RoundWindow) -> dict:
    """Serve one round of trace-driven requests on this task's slice; report measured SLO attainment per report."""
    torch = _torch()
    t0 = time.perf_counter()
    placement = current_placement()
    alloc, device = slice_size(placement), placement.device if placement else "cpu"
    times = arrivals(job, window)
    xs, ys = digits_tensors(device)
    pages = torch.cat([xs[_TRAIN_ROWS:], xs[_TRAIN_ROWS:]])  # a request is rows consecutive images of these
    labels = torch.cat([ys[_TRAIN_ROWS:], ys[_TRAIN_ROWS:]])
    starts = _job_rng(window, job, 3).integers(0, _REQUEST_ROWS, sum(len(t) for t in times)).tolist()
    model = service_model(job, device)
    timeline = SliceTimeline(len(placement.gpu_indices) if alloc > 0 else 0, window.round_s)
    work_s: list[float] = []  # full-device seconds of each served request
    correct = 0

    def answer(i: int) -> float:
        nonlocal correct
        page = pages[starts[i]: starts[i] + job.rows]
        with torch.no_grad(), on_slice(placement) as clock:
            pred = model(page).argmax(dim=1)
        correct += int((pred == labels[starts[i]: starts[i] + job.rows]).sum())
        work_s.append(clock.timing.slice_s * clock.timing.share)
        return clock.timing.slice_s

    lat, i = [], 0
    for ts in times:
        out = np.full(len(ts), np.inf)
        for n, t in enumerate(ts.tolist()):
            done = timeline.run(t, lambda: answer(i))
            if done is not None:
                out[n] = done - t
            i += 1
        lat.append(out)
    typical = float(np.median(work_s)) if work_s else 0.0
    fair = attainment(_replay_fair(times, work_s, typical, window), job)
    counts = np.array([len(ts) for ts in times])
    finite = np.concatenate(lat)[np.isfinite(np.concatenate(lat))] if lat else np.zeros(0)
    return {
        "job": job.name, "kind": job.kind, "alloc": alloc, "device": device,
        "loads": (counts / window.report_s).tolist(), "perf": attainment(lat, job).tolist(),
        "sigma": (0.5 / np.sqrt(np.maximum(counts, 1))).tolist(), "fair_perf": fair.tolist(),
        "requests": int(counts.sum()), "served": len(finite), "throughput": len(finite) / window.round_s,
        "accuracy": correct / max(1, len(work_s) * job.rows), "work_ms": typical * 1000,
        "p99_latency_ms": float(np.percentile(finite, 99) * 1000) if len(finite) else math.inf,
        "wall_s": time.perf_counter() - t0,
    }


def _replay_fair(times: list[np.ndarray], work_s: list[float], typical: float, window: RoundWindow) -> list[np.ndarray]:
    """Latencies the same arrivals would have had on the fair share: the measured full-device work of each
    served request (the median for those the real slice never started), replayed on a fair-share timeline."""
    devices, share = _fair_slices(window)
    timeline = SliceTimeline(devices, window.round_s)
    i, out = 0, []
    for ts in times:
        lat = np.full(len(ts), np.inf)
        for n, t in enumerate(ts.tolist()):
            w = work_s[i] if i < len(work_s) else typical
            done = timeline.run(t, lambda: w / share)
            if done is not None:
                lat[n] = done - t
            i += 1
        out.append(lat)
    return out


@task(name="cilantro-trainer")
def run_trainer(job: JobConfig, window: RoundWindow, checkpoint_in: str | None, checkpoint_out: str) -> dict:
    """Train for one round on this task's slice, steps back to back; report measured steps/s per report."""
    torch = _torch()
    t0 = time.perf_counter()
    placement = current_placement()
    alloc, device = slice_size(placement), placement.device if placement else "cpu"
    xs, ys = digits_tensors(device)
    model = mlp(job.hidden, window.seed, device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    total = 0
    if checkpoint_in and Path(checkpoint_in).is_file():
        ckpt = torch.load(checkpoint_in, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        total = int(ckpt["steps"])
    gen = torch.Generator().manual_seed(int(_job_rng(window, job, 4).integers(2**31)))
    timeline = SliceTimeline(len(placement.gpu_indices) if alloc > 0 else 0, window.round_s)
    done_at, work_s, loss = [], [], math.nan

    def step() -> float:
        nonlocal loss
        idx = torch.randint(0, _TRAIN_ROWS, (job.rows,), generator=gen).to(device)
        with on_slice(placement) as clock:
            opt.zero_grad()
            out = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
            out.backward()
            opt.step()
        loss = float(out.detach())
        work_s.append(clock.timing.slice_s * clock.timing.share)
        return clock.timing.slice_s

    model.train()
    while (done := timeline.run(0.0, step)) is not None:
        done_at.append(done)
    steps = np.bincount(np.minimum((np.array(done_at) // window.report_s).astype(int), window.reports - 1),
                        minlength=window.reports)
    total += int(steps.sum())
    with torch.no_grad():
        accuracy = float((model.eval()(xs[_TRAIN_ROWS:]).argmax(dim=1) == ys[_TRAIN_ROWS:]).float().mean())
    Path(checkpoint_out).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "steps": total}, checkpoint_out)
    perf = steps / window.report_s
    w = np.array(work_s) if work_s else np.full(1, math.nan)
    spread = float(w.std() / w.mean()) if work_s else 0.0
    devices, share = _fair_slices(window)
    fair_rate = devices * share / float(np.median(w)) if work_s else 0.0  # the same steps on the fair share
    return {
        "job": job.name, "kind": job.kind, "alloc": alloc, "device": device,
        "loads": [1.0] * window.reports, "perf": perf.tolist(),
        "sigma": np.maximum(spread * perf, 1.0 / window.report_s).tolist(),
        "fair_perf": [fair_rate] * window.reports, "steps": int(steps.sum()), "total_steps": total,
        "throughput": float(steps.sum() / window.round_s), "loss": loss, "accuracy": accuracy,
        "work_ms": float(np.median(w)) * 1000 if work_s else 0.0, "wall_s": time.perf_counter() - t0,
    }
