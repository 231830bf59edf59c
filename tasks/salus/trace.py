"""A seeded job trace of small real torch trainers and inference loops for one Salus device (thesis §2.5.1).

The thesis replays a production-like trace of Table A.1 training jobs (§2.5.1, Table 2.1) and serves
inference instances beside them (§2.5.3). ``sharing_trace`` draws the same mix, scaled down from minutes to
seconds: Poisson arrivals, log-normal (heavy-tailed) iteration counts, every trainer a Table A.1 workload
(``gpu.sim.salus.workloads``) and every inference loop one of S5's instances. Each job runs a stand-in torch model
whose memory is its workload's at ``tasks.salus.standin.MEMORY_SCALE`` (an MLP on scikit-learn's digits: the
persistent memory sets its width, the ephemeral memory its batch; one Salus iteration is one Adam step, or one
batch of requests). What Salus is told comes from running it: the flow measures each stand-in alone
(``tasks.salus.standin.measure``) and its jobs declare the measured memory and, as SRTF's prior, iterations x the
measured iteration time; or they declare no memory and the runner profiles each one on admission
(``tasks.salus.profiling``).

    trace = sharing_trace(jobs=8, seed=0, mean_gap_s=0.1, median_iterations=20)
    trace[0]  # SharingJob(job_id='job0', kind='train', workload='resnet50_50', iterations=18, hidden=281, ...)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from prefect import task

from gpu.errors import ConfigError
from gpu.scenario import MAX_SEED, choose, entries, integer, positive, require
from gpu.sim.salus.workloads import all_workloads, inference_instances, workload
from tasks.digits import digits_tensors, mlp
from tasks.runtime.requests import current_placement
from tasks.salus.executor import salus_iterations, salus_job
from tasks.salus.placement import placement_lane
from tasks.salus.standin import StandIn, answer, stand_in, train_step

KINDS = ("train", "infer")
JOB_KEYS = ("kind", "workload", "iterations", "arrival_s")
# A trace is real torch work on one device, run once per policy: bounds that keep a flow run within hours.
MAX_TRACE_JOBS = 1_000
MAX_ITERATIONS = 100_000  # a job's iterations (and the median of a seeded trace's)
MAX_GAP_S = 3_600.0  # mean seconds between arrivals, and the latest arrival of an explicit trace, in hours
MAX_ARRIVAL_S = 24 * 3_600.0


@dataclass(frozen=True)
class SharingJob:
    """One job of the trace: the workload it stands in for and the torch work it does.

    ``workload``: a Table A.1 ``<model>_<batch>`` for a trainer, an S5 model name for an inference loop;
    ``hidden``, ``batch``: the stand-in MLP's width and the samples (requests) of one Salus iteration
    (``tasks.salus.standin``); ``u``: the workload's compute intensity in our Table A.1 (the simulator's
    contention input when the flow predicts the run).
    """

    job_id: str
    kind: str
    workload: str
    arrival_s: float
    iterations: int
    hidden: int
    batch: int
    u: float

    @property
    def shape(self) -> StandIn:
        return StandIn(self.kind, self.hidden, self.batch)

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _instances() -> dict[str, Any]:
    return {i.instance_id.split("#")[0]: i for i in inference_instances(1)}


def sharing_job(job_id: str, kind: str, name: str, iterations: int, arrival_s: float,
                field: str = "workload") -> SharingJob:
    """A trainer of Table A.1 workload ``name`` or an inference loop of S5 model ``name`` (ConfigError naming
    ``field`` if unknown)."""
    if kind == "train":
        w = workload(choose(name, field, all_workloads()))
        p, e, u = w.persistent_mb, w.ephemeral_mb, w.u
    else:
        instance = _instances()[choose(name, field, sorted(_instances()))]
        p, e, u = instance.persistent_mb, instance.ephemeral_mb, instance.u
    shape = stand_in(kind, p, e)
    return SharingJob(job_id, kind, name, arrival_s, iterations, shape.hidden, shape.batch, u)


def sharing_trace(jobs: int, seed: int, mean_gap_s: float, median_iterations: int, sigma: float = 0.8,
                  inference_share: float = 0.25) -> list[SharingJob]:
    """``jobs`` jobs, seeded: arrivals ``mean_gap_s`` apart on average (the first at 0), iterations log-normal
    around ``median_iterations`` (at least 2, at most MAX_ITERATIONS), a trainer of a uniform Table A.1 workload
    or, with probability ``inference_share``, an inference loop of a uniform S5 model. Each argument is checked
    (ConfigError naming it) within the bounds above."""
    integer(jobs, "jobs", minimum=1, maximum=MAX_TRACE_JOBS)
    integer(seed, "seed", minimum=0, maximum=MAX_SEED)
    positive(mean_gap_s, "gap_s", allow_zero=True, upper=MAX_GAP_S)
    integer(median_iterations, "median_iterations", minimum=1, maximum=MAX_ITERATIONS)
    rng = np.random.default_rng(seed)
    trainers, models = all_workloads(), sorted(_instances())
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(mean_gap_s, jobs - 1))])
    out = []
    for i, at in enumerate(arrivals):
        infer = rng.random() < inference_share
        name = models[rng.integers(len(models))] if infer else trainers[rng.integers(len(trainers))]
        iterations = min(MAX_ITERATIONS, max(2, round(float(rng.lognormal(np.log(median_iterations), sigma)))))
        out.append(sharing_job(f"job{i}", "infer" if infer else "train", name, iterations, float(at)))
    return out


def explicit_trace(rows: Sequence[Mapping[str, Any]]) -> list[SharingJob]:
    """Jobs given one by one: ``[{kind: train|infer, workload, iterations, arrival_s}]`` (``kind`` defaults to
    train, ``arrival_s`` to 0), checked field by field."""
    parsed = entries(rows, "trace", JOB_KEYS)
    if not parsed or len(parsed) > MAX_TRACE_JOBS:
        raise ConfigError("trace", rows, f"must list 1 to {MAX_TRACE_JOBS:,} jobs")
    out = []
    for i, row in enumerate(parsed):
        where = f"trace[{i}]"
        kind = choose(row.get("kind", "train"), f"{where}.kind", list(KINDS))
        iterations = integer(require(row, "iterations", f"{where}."), f"{where}.iterations", minimum=1,
                             maximum=MAX_ITERATIONS)
        arrival = positive(row.get("arrival_s", 0.0), f"{where}.arrival_s", allow_zero=True, upper=MAX_ARRIVAL_S)
        name = require(row, "workload", f"{where}.")
        out.append(sharing_job(f"job{i}", kind, name, iterations, arrival,
                               f"{where}.workload"))
    return sorted(out, key=lambda j: j.arrival_s)


# -- the jobs: real torch work, one Salus iteration per pass ------------------------------------------------
def warm_up() -> None:
    """One Adam step of the stand-in model in this process: thread-mode jobs share its imports (torch,
    scikit-learn, and what the first optimizer step loads), which the first policy run would otherwise pay
    inside its first job's setup (seconds on a busy machine)."""
    import torch

    xs, ys = digits_tensors("cpu")
    model = mlp(8, 0, "cpu")
    train_step(model, torch.optim.Adam(model.parameters()), xs, ys, 8, torch.Generator().manual_seed(0))


def _outcome(job_id: str, spans: list[tuple[float, float]], admitted: float, **extra: Any) -> dict[str, Any]:
    placement = current_placement()
    lane = placement_lane(placement)
    return {"job": job_id, "lane": lane.lane_id if lane else -1, "device": placement.device,
            "admitted": admitted, "spans": spans, **extra}


@salus_job()  # each trace job declares its stand-in's measured memory with salus_options, or is profiled
@task
def train_job(job_id: str, hidden: int, batch: int, iterations: int, seed: int) -> dict[str, Any]:
    """A trainer: each Salus iteration is one Adam step of the MLP on ``batch`` digits; returns its iteration
    spans (wall clock), its lane and the accuracy it reached."""
    import torch

    admitted = time.time()
    torch.set_num_threads(1)
    device = torch.device(current_placement().device)
    xs, ys = digits_tensors(device)
    model = mlp(hidden, seed, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    spans = []
    for _ in salus_iterations(iterations):
        start = time.time()
        train_step(model, opt, xs, ys, batch, gen)
        spans.append((start, time.time()))
    with torch.no_grad():
        accuracy = float((model(xs).argmax(1) == ys).float().mean())
    return _outcome(job_id, spans, admitted, accuracy=accuracy)


@salus_job()  # each trace job declares its stand-in's measured memory with salus_options, or is profiled
@task
def infer_job(job_id: str, hidden: int, batch: int, iterations: int, seed: int) -> dict[str, Any]:
    """An inference loop: each Salus iteration answers a batch of ``batch`` requests (digits to classify, forward
    only); returns its iteration spans, its lane and how many requests it served."""
    import torch

    admitted = time.time()
    torch.set_num_threads(1)
    device = torch.device(current_placement().device)
    xs, _ = digits_tensors(device)
    model = mlp(hidden, seed, device).eval()
    gen = torch.Generator().manual_seed(seed)
    spans, served = [], 0
    for _ in salus_iterations(iterations):
        start = time.time()
        served += answer(model, xs, batch, gen)
        spans.append((start, time.time()))
    return _outcome(job_id, spans, admitted, served=served)


JOB_TASKS = {"train": train_job, "infer": infer_job}
