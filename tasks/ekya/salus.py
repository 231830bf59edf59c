"""Ekya's retraining and inference on a device as co-located Salus jobs (``--executor salus``).

With ``--executor slices`` each stream's retraining job and inference periods are separate tasks holding
the GPU fractions Ekya decided, and nothing on a real GPU enforces those fractions between them (CUDA
time-slices processes as it likes). Here every device of the pool gets one Salus executor (P. Yu, PhD thesis
U. Michigan 2022, Ch. 2) with **one shared lane under weighted FAIR**, and each job is admitted into it
with Ekya's decided GPUs as its weight (the weighted-FAIR extension of ``gpu.schedulers.salus.policies``).
One lane, because lanes run concurrently and Salus does not control compute across them (§2.3.3, §5.1):
only jobs sharing a lane are switched by the policy. A retraining iteration is one SGD step, an inference
iteration a batch of ``tasks.ekya.work.FRAMES_PER_ITERATION`` live frames; a job computes only while it
holds the lane's token, and FAIR hands the token to the job with the least GPU time served per weight, so
over time each job gets its weight's share of the device (§2.4.3's quantum: one iteration).

The jobs still lease Ekya's fractions on the pool ledger, pinned on the device Ekya's plan put them on
(``gpu.schedulers.ekya.placement``): the ledger stays the account of who holds what, the executors hold no
lease of their own (``SalusExecutor(lease=False)``) and only order iterations inside it. Slice time is
measured as with slices (``tasks.runtime.slices``), so a window's decisions and accuracies are produced the same
way. Because a period's end is known only once the retraining that ends it has run, a period's inference
job starts when the period opens and serves the frames up to the window's end; the flow keeps the frames of
the period (``FrameAnswers.segment``).

What the executors measured is each window's ``LaneReport``: lanes used, how long each job waited for
admission, and per device the shares of GPU time the jobs really got from the token log (every iteration's
measured time, as the job reported it when it handed the token on) against the shares Ekya decided.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

from gpu.schedulers.ekya.thief import train_job
from gpu.schedulers.salus.controller import SalusJob
from tasks.ekya.work import FrameAnswers, SegmentResult, WindowSettings
from tasks.digits import MLP_EPHEMERAL_MB, mlp_resident_mb
from tasks.salus.lanes import LoggedSalusExecutor, submit_in_lane

EXECUTORS = ("slices", "salus")
JOBS_PER_DEVICE = 8
"""Worker processes per device under ``--executor salus``: a retraining and an inference job per stream sharing
a device, plus a closed period's inference job still serving its last frames."""
def persistent_mb(settings: WindowSettings, training: bool) -> float:
    """The stream model's resident memory: its weights, plus gradients and Adam's two moments when training."""
    return mlp_resident_mb(settings.hidden, 4 if training else 1)


@dataclass(frozen=True)
class SharedSpan:
    """A device's longest stretch with the same jobs competing for its lane, and what each got of it.

    ``decided``: the job's weight over the weights of the jobs competing (Ekya's split of the device);
    ``realised``: its share of the GPU time the lane served meanwhile (token log). Keys are Ekya job names
    (``cam0/train``, ``cam0/infer``; a stream's inference jobs of two periods count together).
    """

    device: int
    gpu_s: float
    iterations: int
    decided: dict[str, float]
    realised: dict[str, float]
    longest_s: float = 0.0  # the span's longest iteration: FAIR evens service out only to within one iteration

    @property
    def error(self) -> float:
        return max(abs(self.realised[j] - self.decided[j]) for j in self.decided)

    @property
    def lag_bound(self) -> float:
        """How far a realised share may sit from its decided one when least-service-first FAIR works: the
        jobs' weighted service differs by at most one iteration at every hand-off, so a share is off by at
        most ``longest_s / gpu_s`` (an iteration stretched by a busy CPU widens this, over a short span)."""
        return self.longest_s / self.gpu_s if self.gpu_s > 0 else 1.0


@dataclass(frozen=True)
class LaneReport:
    """One window's Salus record: lanes used, admission waits (s) and realised vs decided shares."""

    lanes: int  # the most lanes open at once, summed over devices (one per device in use: one shared lane each)
    admission_wait_s: dict[str, float]  # per admitted job (``<ekya job>#<n>``)
    iterations: dict[str, int]
    spans: tuple[SharedSpan, ...] = ()

    def metrics(self) -> dict[str, float]:
        """The MLflow metrics of a window's run."""
        waits = list(self.admission_wait_s.values()) or [0.0]
        out = {"salus.lanes": float(self.lanes), "salus.admission_wait_s_max": max(waits),
               "salus.admission_wait_s_mean": sum(waits) / len(waits)}
        for span in self.spans:
            for job in span.decided:
                out[f"salus.gpu{span.device}.{job}.decided_share"] = span.decided[job]
                out[f"salus.gpu{span.device}.{job}.realised_share"] = span.realised[job]
        if self.spans:
            out["salus.max_share_error"] = max(s.error for s in self.spans)
        return out

    def summary(self) -> dict[str, Any]:
        """What the flow returns per window."""
        return {"lanes": self.lanes, "admission_wait_s": self.admission_wait_s, "iterations": self.iterations,
                "shares": [{"device": s.device, "gpu_s": s.gpu_s, "iterations": s.iterations, "decided": s.decided,
                            "realised": s.realised, "lag_bound": s.lag_bound}
                           for s in self.spans]}


def shared_span(device: int, log: Sequence[tuple[float, str, float]], weights: dict[str, float],
                names: dict[str, str]) -> SharedSpan | None:
    """Realised vs decided shares over the longest stretch of ``log`` (one lane's iteration ends) in which the
    same two or more jobs were running. A job runs from its first iteration's start to its last one's end;
    each iteration counts for the jobs running at its midpoint."""
    spans: dict[str, tuple[float, float]] = {}
    for t, job, gpu_s in log:
        lo, hi = spans.get(job, (t - gpu_s, t))
        spans[job] = (min(lo, t - gpu_s), max(hi, t))
    served: dict[frozenset[str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[frozenset[str], int] = defaultdict(int)
    longest: dict[frozenset[str], float] = defaultdict(float)
    for t, job, gpu_s in log:
        mid = t - gpu_s / 2
        running = frozenset(j for j, (lo, hi) in spans.items() if lo <= mid <= hi)
        served[running][job] += gpu_s
        counts[running] += 1
        longest[running] = max(longest[running], gpu_s)
    contended = [jobs for jobs in served if len(jobs) >= 2]
    if not contended:
        return None
    jobs = max(contended, key=lambda js: sum(served[js].values()))
    total, weight = sum(served[jobs].values()), sum(weights[j] for j in jobs)
    decided: dict[str, float] = defaultdict(float)
    realised: dict[str, float] = defaultdict(float)
    for j in jobs:
        decided[names[j]] += weights[j] / weight
        realised[names[j]] += served[jobs][j] / total if total > 0 else 0.0
    return SharedSpan(device, total, counts[jobs], dict(decided), dict(realised), longest[jobs])


@dataclass
class _Admitted:
    name: str
    device: int
    weight: float
    wait_s: float


@dataclass
class EkyaLanes:
    """A window's Salus executors (one per device, opened on first use) and the jobs admitted to them.

    Args:
        device_mb: the pool's devices' memory (MiB), by device index.
        settings: the window's sizes (the jobs' declared memory follows the stream model's size).
    """

    device_mb: Sequence[float]
    settings: WindowSettings
    _executors: dict[int, LoggedSalusExecutor] = field(default_factory=dict)
    _jobs: dict[str, _Admitted] = field(default_factory=dict)
    _futures: list[Any] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def executor(self, device: int) -> LoggedSalusExecutor:
        with self._lock:
            if device not in self._executors:
                self._executors[device] = LoggedSalusExecutor(None, device, capacity_mb=self.device_mb[device],
                                                          policy="weighted_fair", lease=False)
            return self._executors[device]

    def submit(self, task: Any, name: str, devices: tuple[int, ...], gpus: float, label: str, *args: Any,
               **kwargs: Any) -> Any:
        """Admit Ekya job ``name`` (e.g. ``cam0/train``) into the lane of ``devices[0]`` with weight ``gpus``,
        then submit ``task`` with the lane on Ekya's fraction of that device; the job leaves the lane when
        its task ends, whatever way it ends (completed, failed, cancelled, crashed)."""
        device = devices[0]
        executor = self.executor(device)
        job_id = f"{name}#{uuid.uuid4().hex[:8]}"
        training = name == train_job(name.split("/")[0])
        job = SalusJob(job_id, persistent_mb(self.settings, training), MLP_EPHEMERAL_MB, weight=gpus, on_demand=True)
        future, _, waited = submit_in_lane(executor, job, task, dict(gpus=gpus, devices=devices, label=label),
                                           *args, **kwargs)
        self._jobs[job_id] = _Admitted(name, device, gpus, waited)
        self._futures.append(future)
        return future

    def close(self) -> LaneReport:
        """Wait for every job to end (a period's inference job may still serve frames past its period), close
        the executors and report what they measured."""
        for future in self._futures:
            future.wait()
        with self._lock:
            executors, self._executors = dict(self._executors), {}
        for executor in executors.values():
            executor.close()
        names = {j: a.name for j, a in self._jobs.items()}
        weights = {j: a.weight for j, a in self._jobs.items()}
        counts: dict[str, int] = defaultdict(int)
        spans = []
        for device, executor in sorted(executors.items()):
            log = [entry for entry in executor.iterations if entry[1] in self._jobs]
            for _, job, _ in log:
                counts[job] += 1
            span = shared_span(device, log, weights, names)
            if span is not None:
                spans.append(span)
        waits = {j: round(a.wait_s, 6) for j, a in self._jobs.items()}
        return LaneReport(sum(e.peak_lanes for e in executors.values()), waits, dict(counts), tuple(spans))


@dataclass(frozen=True)
class PeriodAnswers:
    """A period served by a Salus inference job: its answers for frames ``[first, last)`` over ``period_s``."""

    future: Any  # PrefectFuture[FrameAnswers]
    last: int
    period_s: float

    def result(self) -> SegmentResult:
        answers: FrameAnswers = self.future.result()
        return answers.segment(self.last, self.period_s)
