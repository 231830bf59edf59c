"""The real jobs that share the pool in the Cilantro allocation-rounds flow (issue #6, thesis ch. 3 §3.7).

Two kinds of job, each run once per round as a Prefect task on the GPU slice its allocation bought
(``with gpu_options(gpus=a_j)``; the task reads the slice size from ``current_placement()``):

* **inference service** (``kind="service"``) — a tiny torch MLP trained on scikit-learn's digits
  answers requests that arrive as a Poisson process whose rate replays the Cilantro Twitter trace
  (``gpu/data/cilantro/twitter_1476_data``, via ``gpu.sim.cilantro_workloads``), scaled so the trace
  median is ``base_load`` requests/s, advancing ``trace_step`` trace values per report (time
  compression). Performance = the fraction of requests answered within ``latency_slo_ms`` (the
  paper's latency SLO attainment); every served request is really classified by the model.
* **training job** (``kind="training"``) — the same kind of MLP trained with Adam on digits
  minibatches, resumed from the previous round's checkpoint. Performance = steps/s (throughput).

How a slice of size ``f`` (GPU units) becomes work capacity — the compute model, one for both
kinds: during report ``k`` the slice delivers ``f · (1 + η ε_k)`` GPU-seconds per second
(``η`` = ``interference``, ε ~ N(0, 1) seeded per job and round, the spec's optional interference
noise). A request costs ``cost_ms`` full-GPU milliseconds, so the service is a FIFO queue with
service time ``cost_ms / (f (1 + η ε_k))``; requests still unanswered at the end of the round
miss the SLO and are dropped. A training step costs ``cost_ms`` full-GPU milliseconds, so a round
runs ``⌊f · (1 + η ε_k) · report_s / cost⌋`` real optimizer steps per report. Time is virtual
(``round_s`` seconds of it per round, replayed as fast as the real torch work goes), so
SLO attainment and throughput depend on ``f`` and the load, not on how busy this machine is; the
amount of real work done (requests classified, steps taken) is proportional to ``f``.

Each task reports per report period ``(load, perf, σ)`` for the learners — σ = ``0.5/√N`` for a
fraction of ``N`` requests (the largest binomial standard error, as in ``gpu.sim.cilantro``) and
``η · perf`` for throughput — plus the performance the same arrivals would have had on the fair
share ``R/n`` (the denominator of F_NJC, eq. 3.3).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from prefect import task

from gpu.errors import ConfigError
from gpu.sim.cilantro_workloads import TRACE_MEDIAN, load_trace
from tasks.requests import TaskPlacement, current_placement

KINDS = ("service", "training")
_TRAIN_ROWS = 1200  # digits rows used for training; the rest are the requests / held-out set


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
        cost_ms: full-GPU milliseconds per request (service) or per training step (training).
        base_load: requests/s at the trace median (service).
        latency_slo_ms: latency bound of a request (service).
        trace_offset: where in the trace this service starts.
    """

    name: str
    kind: str
    slo: float | None
    utility: str = "linear"
    weight: float = 1.0
    cost_ms: float = 4.0
    base_load: float = 60.0
    latency_slo_ms: float = 50.0
    trace_offset: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"{self.name}.kind", self.kind, f"unknown; choose one of {list(KINDS)}")
        for field in ("cost_ms", "base_load", "latency_slo_ms"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{self.name}.{field}", value, "must be a number > 0")
        if self.kind == "service" and self.slo is not None and not 0 < self.slo <= 1:
            raise ConfigError(f"{self.name}.slo", self.slo, "a service's SLO is a fraction of requests in (0, 1]")

    @property
    def cost_s(self) -> float:
        return self.cost_ms / 1000.0

    @property
    def learner_upper(self) -> float:
        """Right end of the learner's input ``x = a/ℓ``: at ``4·cost`` GPU per req/s the queue is at
        25 % utilisation and the curve is flat; training (ℓ ≡ 1) saturates nowhere, see the flow."""
        return 4.0 * self.cost_s

    @property
    def lipschitz(self) -> float:
        """Slope bound of perf vs ``x``: services rise 0 → 1 within ``x ∈ [cost/1.2, 2 cost]``
        (≈ 0.85/cost), so 2/cost is safe; training is exactly linear with slope 1/cost."""
        return 2.0 / self.cost_s if self.kind == "service" else 1.5 / self.cost_s


@dataclass(frozen=True)
class RoundWindow:
    """The round every job runs in: its index, virtual length, report period and seeds."""

    round_index: int
    round_s: float
    report_s: float
    fair_share: float
    trace_step: int = 1
    interference: float = 0.05
    seed: int = 0

    @property
    def reports(self) -> int:
        return max(1, int(round(self.round_s / self.report_s)))


def slice_size(placement: TaskPlacement | None) -> float:
    """GPU units the task holds: the fraction of each of its devices times their number."""
    if placement is None or not placement.gpu_indices:
        return 0.0
    return float(placement.fraction) * len(placement.gpu_indices)


def _job_rng(window: RoundWindow, job: JobConfig, stream: int) -> np.random.Generator:
    key = [window.seed, window.round_index, stream] + [ord(c) for c in job.name]
    return np.random.default_rng(key)


def speeds(window: RoundWindow, job: JobConfig, alloc: float) -> np.ndarray:
    """GPU-seconds per second the slice delivers in each report (interference noise, ≥ 0)."""
    eps = _job_rng(window, job, 1).standard_normal(window.reports)
    return np.maximum(alloc * (1.0 + window.interference * eps), 0.0)


def service_loads(job: JobConfig, window: RoundWindow) -> np.ndarray:
    """Mean request rate (req/s) of each report: the trace, ping-pong replayed, median → ``base_load``."""
    trace = load_trace()
    pingpong = np.concatenate([trace, trace[::-1]])
    first = window.round_index * window.reports
    idx = (job.trace_offset + (first + np.arange(window.reports)) * window.trace_step) % len(pingpong)
    return pingpong[idx] * job.base_load / TRACE_MEDIAN


def arrivals(job: JobConfig, window: RoundWindow, rates: np.ndarray | None = None) -> list[np.ndarray]:
    """Poisson arrival times (virtual seconds since the round start), one array per report."""
    rng = _job_rng(window, job, 2)
    rates = service_loads(job, window) if rates is None else rates
    out = []
    for k, rate in enumerate(rates):
        n = rng.poisson(rate * window.report_s)
        out.append(np.sort(k * window.report_s + rng.uniform(0.0, window.report_s, n)))
    return out


def queue_latencies(times: list[np.ndarray], speed: np.ndarray, job: JobConfig, window: RoundWindow) -> list[np.ndarray]:
    """FIFO service of the arrivals; latency (s) per request, ``inf`` if unanswered by the round's end.

    A request that starts service in report ``k`` takes ``cost / speed_k`` seconds (Lindley's recursion).
    """
    end_of_round = window.reports * window.report_s
    service = [job.cost_s / v if v > 0 else math.inf for v in np.asarray(speed, dtype=float).tolist()]
    last = window.reports - 1
    free_at = 0.0
    out = []
    for ts in times:
        lat = np.full(len(ts), np.inf)
        for i, t in enumerate(ts.tolist()):  # plain floats: ~10x faster than numpy scalars
            start = t if t > free_at else free_at
            done = start + service[min(int(start // window.report_s), last)]
            if done > end_of_round:
                break  # unanswered by the end of the round (and so is everything behind it)
            free_at = done
            lat[i] = done - t
        out.append(lat)
    return out


def attainment(latencies: list[np.ndarray], job: JobConfig) -> np.ndarray:
    """Per report: fraction of requests answered within the latency SLO (1 when no request came)."""
    bound = job.latency_slo_ms / 1000.0
    return np.array([float(np.mean(lat <= bound)) if len(lat) else 1.0 for lat in latencies])


def expected_perf(job: JobConfig, alloc_grid: np.ndarray, load: float, report_s: float, seed: int = 0) -> np.ndarray:
    """The job's true curve at a constant load: what oracle policies are given (same compute model, no noise)."""
    grid = np.asarray(alloc_grid, dtype=float)
    if job.kind == "training":
        return grid / job.cost_s
    window = RoundWindow(0, 4 * report_s, report_s, 0.0, interference=0.0, seed=seed)
    times = arrivals(job, window, np.full(window.reports, load))
    return np.array([attainment(queue_latencies(times, np.full(window.reports, a), job, window), job).mean()
                     for a in grid])


def _torch():
    """torch with one intra-op thread: these models are tiny, and jobs sharing a CPU with more threads
    spin against each other (500 steps: 0.3 s CPU with 1 thread, 8 s with 2 on a loaded 2-core box)."""
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    return torch


@lru_cache(maxsize=4)
def _digits(device: str):
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (torch.tensor(x / 16.0, dtype=torch.float32, device=device), torch.tensor(y, device=device))


def _mlp(seed: int, device: str):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(device)


@lru_cache(maxsize=8)
def _service_model(seed: int, device: str):
    """The service's classifier, trained once per worker (200 Adam steps on the training rows)."""
    import torch

    xs, ys = _digits(device)
    model = _mlp(seed, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(200):
        idx = torch.randint(0, _TRAIN_ROWS, (64,), generator=gen).to(device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
        opt.step()
    return model.eval()


@task(name="cilantro-service")
def run_service(job: JobConfig, window: RoundWindow) -> dict:
    """Serve one round of trace-driven requests on this task's slice; report SLO attainment per report."""
    torch = _torch()

    t0 = time.perf_counter()
    placement = current_placement()
    alloc = slice_size(placement)
    device = placement.device if placement else "cpu"
    times = arrivals(job, window)
    lat = queue_latencies(times, speeds(window, job, alloc), job, window)
    fair = attainment(queue_latencies(times, speeds(window, job, window.fair_share), job, window), job)
    served = np.concatenate([np.isfinite(v) for v in lat]) if lat else np.zeros(0, bool)
    correct = 0
    if served.any():
        xs, ys = _digits(device)
        pick = _job_rng(window, job, 3).integers(_TRAIN_ROWS, len(ys), int(served.sum()))
        model = _service_model(0, device)  # trains on first use: outside no_grad
        with torch.no_grad():
            pred = model(xs[pick]).argmax(dim=1)
        correct = int((pred == ys[pick]).sum())
    counts = np.array([len(ts) for ts in times])
    finite = np.concatenate(lat)[served] if served.any() else np.zeros(0)
    return {
        "job": job.name, "kind": job.kind, "alloc": alloc, "device": device,
        "loads": (counts / window.report_s).tolist(), "perf": attainment(lat, job).tolist(),
        "sigma": (0.5 / np.sqrt(np.maximum(counts, 1))).tolist(), "fair_perf": fair.tolist(),
        "requests": int(counts.sum()), "served": int(served.sum()), "throughput": float(served.sum() / window.round_s),
        "accuracy": correct / max(1, int(served.sum())),
        "p99_latency_ms": float(np.percentile(finite, 99) * 1000) if len(finite) else math.inf,
        "wall_s": time.perf_counter() - t0,
    }


@task(name="cilantro-trainer")
def run_trainer(job: JobConfig, window: RoundWindow, checkpoint_in: str | None, checkpoint_out: str) -> dict:
    """Train for one round on this task's slice (steps bought by its compute budget); report steps/s."""
    torch = _torch()

    t0 = time.perf_counter()
    placement = current_placement()
    alloc = slice_size(placement)
    device = placement.device if placement else "cpu"
    xs, ys = _digits(device)
    model = _mlp(window.seed, device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    total = 0
    if checkpoint_in and Path(checkpoint_in).is_file():
        ckpt = torch.load(checkpoint_in, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        total = int(ckpt["steps"])
    gen = torch.Generator().manual_seed(int(_job_rng(window, job, 4).integers(2**31)))
    budget = speeds(window, job, alloc) * window.report_s / job.cost_s
    steps = np.diff(np.floor(np.concatenate([[0.0], np.cumsum(budget)]))).astype(int)  # carry fractions over
    loss = math.nan
    model.train()
    for n in steps:
        for _ in range(int(n)):
            idx = torch.randint(0, _TRAIN_ROWS, (32,), generator=gen).to(device)
            opt.zero_grad()
            out = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
            out.backward()
            opt.step()
            loss = float(out.detach())
    total += int(steps.sum())
    with torch.no_grad():
        accuracy = float((model.eval()(xs[_TRAIN_ROWS:]).argmax(dim=1) == ys[_TRAIN_ROWS:]).float().mean())
    Path(checkpoint_out).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "steps": total}, checkpoint_out)
    perf = steps / window.report_s
    fair = speeds(window, job, window.fair_share) / job.cost_s
    return {
        "job": job.name, "kind": job.kind, "alloc": alloc, "device": device,
        "loads": [1.0] * window.reports, "perf": perf.tolist(),
        "sigma": np.maximum(max(window.interference, 0.01) * perf, 1.0 / window.report_s).tolist(),
        "fair_perf": fair.tolist(), "steps": int(steps.sum()), "total_steps": total,
        "throughput": float(steps.sum() / window.round_s), "loss": loss, "accuracy": accuracy,
        "wall_s": time.perf_counter() - t0,
    }
