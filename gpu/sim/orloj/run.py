"""``gpuflows simulate orloj``: one GPU worker serving a dynamic DNN, ORLOJ against its baselines (thesis §4.5).

The world owns the clock (``gpu.sim.events.EventLoop``) and the truth: each request's alone time is sampled
from its application's distribution, and a batch runs as long as the scenario's cost model says for those true
times (``CostSpec``: by default a measured dynamic DNN's batch costs, ``gpu.sim.orloj.batch_cost``; or Eq. 4.3
with a chosen overhead), both a ``gpu.schedulers.orloj.cost_model.PaddedBatchModel``. It drives one
``gpu.schedulers.orloj.controller.OrlojController`` per run, which owns the queue and the policy. The policies
are the runtime's batch policies, built by name through the registry (``gpu.systems.make_batch_policy``); they
see only requests, deadlines and what their profiler measured:

* ORLOJ: per-application histograms of alone times, from a warm profiler (``PROFILE_SAMPLES`` requests per
  application timed alone) or, with ``orloj.profiler: online``, from ``COLD_SAMPLES`` per application and then
  the online profiler (§4.3.2, ``gpu.schedulers.orloj.profiler``): the world times the finished requests the
  controller samples alone and, every ``orloj.epoch_s`` of its clock, hands them to the controller's
  ``on_epoch`` — the hook, and the boundaries, the serving rollout drives on the wall clock with the batches its
  workers measured (``tasks.serving.epochs``);
* the Clockwork-, Nexus- and Clipper-like baselines (``gpu.schedulers.orloj.baselines``): a point estimate per
  batch size, the batch cost of requests that all take the mean alone time (what a profiler that assumes
  data-independence measures). Nexus plans its batch and duty cycle once from that profile and the offered rate
  with its own squishy bin packing (``gpu.schedulers.nexus.squishy``, §6.1) and keeps them; Clockwork and
  Clipper also see the executed batches through ``observe``.

Choices the thesis leaves open (``docs/orloj.md``): Poisson arrivals at ``load`` × the system's capacity, the
best batch throughput ``max_bs bs / E[batch time of bs random requests]`` of the true costs (whatever policy
runs); SLO = m × P99 of the alone times; a request is on time when its batch ends by its deadline, and dropped or
late otherwise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from gpu.batching import BatchContext, BatchPolicy, InferenceRequest
from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.systems import make_batch_policy
from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.schedulers.nexus.profiles import table_profile
from gpu.schedulers.nexus.squishy import Session, SquishyPacker
from gpu.schedulers.orloj.policy import Histogram
from gpu.schedulers.orloj.controller import BatchDone, Dispatch, OrlojController, Reprofiled
from gpu.schedulers.orloj.policies import POLICIES
from gpu.schedulers.orloj.profiler import OnlineProfiler
from gpu.scenario import choose, within_events
from gpu.sim.events import EventLoop
from gpu.sim.nexus.engine import SessionStats, arrival_times
from gpu.sim.orloj.workload import Case, OrlojScenario, load

PROFILE_SAMPLES = 20_000
COLD_SAMPLES = 30  # an online-profiled ORLOJ starts from this many alone times per application
CAPACITY_BATCHES = 2000  # random batches per size that price the system's capacity
BASELINES = ("clockwork", "nexus", "clipper")


@dataclass(frozen=True)
class MeasuredEpoch:
    """One epoch boundary of the simulated clock: what the world measured since the last one (per application,
    ``(1, alone ms)`` of each request it timed alone) and the controller's ``on_epoch`` decision."""

    t_ms: float
    batches: dict[str, list[tuple[int, float]]]
    decision: Reprofiled


@dataclass
class Outcome(SessionStats):
    """Request counts of one run (the serving engine's, summed over sessions), the policy's decision time, and
    with an online profiler every epoch's measurements and re-profiling decision."""

    decide_s: float = 0.0
    epochs: list[MeasuredEpoch] = field(default_factory=list)

    @property
    def finish_rate(self) -> float:
        """Requests finished by their deadline / requests offered (§4.5, "finish rate")."""
        return self.good / self.offered if self.offered else 0.0


@dataclass(frozen=True, eq=False)
class Setup:
    """What a case fixes before any policy runs: profiled histograms, the batch model, P99, the offered rate."""

    case: Case
    histograms: dict[str, Histogram]
    cold_histograms: dict[str, Histogram]
    model: PaddedBatchModel
    p99_ms: float
    rate_per_s: float
    point_ms: dict[int, float]  # b = 1..max batch: the batch of b mean requests, the baselines' point estimate
    batch_sizes: tuple[int, ...]

    @classmethod
    def build(cls, case: Case, sc: OrlojScenario, seed: int = 12345) -> "Setup":
        rng = np.random.default_rng(seed)
        samples = {a.app_id: a.sample(rng, PROFILE_SAMPLES, case.scale) + case.scale * case.overhead_ms
                   for a in case.apps}
        every = np.concatenate(list(samples.values()))
        hists = {a: Histogram.from_samples(x, sc.bins) for a, x in samples.items()}
        model = sc.cost.batch_model(every)
        rate = sc.load * capacity_per_s(case, model, sc.batch_sizes, rng)
        mean = float(every.mean())  # data-independence: every request costs the average one
        cold = {a: Histogram.from_samples(x[:COLD_SAMPLES], sc.bins) for a, x in samples.items()}
        return cls(case, hists, cold, model, float(np.percentile(every, 99)), rate,
                   {b: model.batch_ms(np.full(b, mean)) for b in range(1, max(sc.batch_sizes) + 1)}, sc.batch_sizes)

    def duration_s(self, sc: OrlojScenario) -> float:
        """How long to offer traffic: ``requests`` expected arrivals when the scenario sets it, else ``duration_s``."""
        return sc.requests / self.rate_per_s if sc.requests else sc.duration_s

    def point_latency(self, b: int) -> float:
        """The point estimate ℓ(b): a batch of ``b`` requests that each take the mean alone time."""
        return self.point_ms[min(b, len(self.point_ms))]


def capacity_per_s(case: Case, model: PaddedBatchModel, sizes: tuple[int, ...], rng: np.random.Generator) -> float:
    """The system's capacity, requests/s: the best ``bs / E[batch time]`` over the batch sizes, each batch of ``bs``
    requests drawn as the workload draws them and priced by the true cost model (no policy involved)."""
    best = 0.0
    for bs in sizes:
        alone = case.sample(rng, CAPACITY_BATCHES * bs)[1].reshape(CAPACITY_BATCHES, bs).max(1)
        ms = model.fixed(bs) + model.factor(bs) * np.maximum(alone - model.c0, 0.0)
        best = max(best, 1000.0 * bs / float(ms.mean()))
    return best


def nexus_plan(setup: Setup, slo_ms: float) -> tuple[int, float]:
    """Nexus's plan of this one-GPU session, ``(batch, duty cycle ms)``: squishy bin packing (§6.1) on the
    mean-latency profile and the offered rate. A session whose SLO even ``2·ℓ(1)`` exceeds is one Nexus refuses
    to plan; it then runs batches of one back to back."""
    profile = table_profile("dynamic", setup.point_ms)
    try:
        plan = SquishyPacker({"dynamic": profile}).plan([Session("s", "dynamic", slo_ms, setup.rate_per_s)],
                                                        max_gpus=1)
    except ConfigError:
        return 1, profile.latency(1)
    node = plan.nodes[0]
    return node.placements[0].batch, node.duty_cycle_ms


def build_policy(name: str, setup: Setup, sc: OrlojScenario, slo_ms: float) -> BatchPolicy:
    """A fresh policy for one worker (baselines keep state, so never shared between runs)."""
    if name == "orloj":
        hists = setup.cold_histograms if sc.profiler == "online" else setup.histograms
        return make_batch_policy("orloj", histograms=hists, model=setup.model, batch_sizes=setup.batch_sizes,
                                 b=sc.b, mix=sc.mix)
    if name == "clockwork":
        return make_batch_policy("clockwork", batch_sizes=setup.batch_sizes)
    if name == "nexus":
        return make_batch_policy("nexus_planned", duty_ms=nexus_plan(setup, slo_ms)[1])
    return make_batch_policy("clipper")


class _World:
    """The simulated side of one GPU worker: arrivals, batch execution on true alone times, outcome counts.

    It drives an ``OrlojController`` (which owns the queue and the policy) with the event loop's clock, and
    charges the hooks' measured thread CPU time to simulated time when asked (RT-6, Fig. 4.14: the thesis pinned
    its scheduler's threads to cores; a wall clock on a shared machine would also charge other processes' time).
    The requests the controller asks to be timed alone are timed off the worker (their true alone times) and
    reported at the next epoch boundary.
    """

    def __init__(self, loop: EventLoop, ctrl: OrlojController, model: PaddedBatchModel, alone: np.ndarray,
                 out: Outcome, charge_decisions: bool):
        self.loop, self.ctrl, self.model, self.alone, self.out = loop, ctrl, model, alone, out
        self.charge = charge_decisions
        self.running: tuple[InferenceRequest, ...] = ()
        self.measured: dict[str, list[tuple[int, float]]] = {}  # this epoch's alone times, as batches of one

    def arrive(self, request: InferenceRequest) -> None:
        self._apply(*self._call(self.ctrl.on_arrival, request))

    def wake(self) -> None:
        self._apply(*self._call(self.ctrl.on_wake))

    def epoch(self) -> None:
        """An epoch boundary: the epoch's alone times to ``on_epoch``; the controller's policy adopts them."""
        batches, self.measured = self.measured, {}
        self.out.epochs.append(MeasuredEpoch(self.loop.now, batches, self.ctrl.on_epoch(self.loop.now, batches)))

    def _done(self, start: float) -> None:
        self._apply(*self._call(self.ctrl.on_job_done, BatchDone(start)))

    def _call(self, hook: Callable, *args) -> tuple[Dispatch, float]:
        t0 = time.thread_time()
        dispatch = hook(self.loop.now, *args)
        spent = time.thread_time() - t0
        if dispatch.run or dispatch.drop:
            self.out.decide_s += spent
        return dispatch, spent

    def _apply(self, d: Dispatch, spent_s: float) -> None:
        self.out.dropped += len(d.drop)
        for r in self.running:  # d.profile names requests of the batch that just finished
            if r.request_id in d.profile:
                self.measured.setdefault(r.app_id, []).append((1, float(self.alone[r.request_id])))
        if d.run:
            self.running = d.run
            start = self.loop.now + (spent_s * 1000.0 if self.charge else 0.0)
            finish = start + self.model.batch_ms(self.alone[[r.request_id for r in d.run]])
            on_time = sum(finish <= r.deadline_ms for r in d.run)
            self.out.good += on_time
            self.out.late += len(d.run) - on_time
            self.out.batches += 1
            self.out.batched += len(d.run)
            self.loop.at(finish, lambda: self._done(start))
        elif d.wake_at_ms is not None:
            self.loop.at(max(self.loop.now, d.wake_at_ms), self.wake)


def serve(setup: Setup, policy: BatchPolicy, slo_ms: float, seed: int, duration_s: float,
          charge_decisions: bool = False, profiler: OnlineProfiler | None = None, epoch_s: float = 10.0) -> Outcome:
    """Offer ``duration_s`` of Poisson traffic to one worker running ``policy``; count finished requests.

    With a ``profiler`` (ORLOJ only), sampled finished requests are timed alone and every ``epoch_s`` of
    offered traffic the controller's ``on_epoch`` re-profiles from them (``Outcome.epochs``).
    """
    rng = np.random.default_rng(seed)
    times = arrival_times(setup.rate_per_s, duration_s, "poisson", rng)
    which, alone = setup.case.sample(rng, len(times))
    apps = [a.app_id for a in setup.case.apps]
    target = nexus_plan(setup, slo_ms)[0]  # the plan's batch, as a serving worker is told its placement's
    top = max(setup.batch_sizes)
    out = Outcome(offered=len(times))
    loop = EventLoop()
    ctrl = OrlojController(policy, lambda now: BatchContext(now, setup.point_latency, target, top), profiler,
                           {a: slo_ms for a in apps})
    world = _World(loop, ctrl, setup.model, alone, out, charge_decisions)
    if profiler is not None:
        for k in range(1, int(duration_s / epoch_s + 1e-9) + 1):
            loop.at(k * epoch_s * 1000.0, world.epoch)
    for i, t in enumerate(times):
        r = InferenceRequest(i, apps[which[i]], float(t), float(t) + slo_ms)
        loop.at(float(t), lambda r=r: world.arrive(r))
    loop.run(until=duration_s * 1000.0 + 20 * slo_ms)
    out.dropped += len(ctrl.queue)  # never served before the drain horizon
    return out


def sweep(sc: OrlojScenario, policies: list[str], seeds: int | None = None,
          charge_decisions: bool = False) -> list[dict]:
    """Finish rate (mean ± std over seeds) of every case × SLO multiplier × policy."""
    setups = [Setup.build(case, sc) for case in sc.cases]
    for setup in setups:  # before any run: an SLO no request can meet is a mistake in the scenario
        within_events(setup.rate_per_s * setup.duration_s(sc), "duration_s", sc.duration_s,
                      f"requests of case {setup.case.name!r} (its rate at load {sc.load:g} x duration_s)")
        shortest = min(h.edges[0] for h in setup.histograms.values())
        for m in sc.slo_multipliers:
            if m * setup.p99_ms < shortest:
                raise ConfigError("slo_multipliers", m, f"SLO {m * setup.p99_ms:.4g} ms of case {setup.case.name!r} "
                                                        f"is below its shortest alone time {shortest:.4g} ms")
    rows = []
    for setup in setups:
        case = setup.case
        for m in sc.slo_multipliers:
            slo = m * setup.p99_ms
            for name in policies:
                runs = [serve(setup, build_policy(name, setup, sc, slo), slo, seed, setup.duration_s(sc),
                              charge_decisions,
                              OnlineProfiler(seed=seed) if name == "orloj" and sc.profiler == "online" else None,
                              sc.epoch_s)
                        for seed in range(seeds or sc.seeds)]
                rates = [r.finish_rate for r in runs]
                rows.append({"case": case.name, "slo_x": m, "policy": name,
                             "finish_rate": float(np.mean(rates)), "std": float(np.std(rates)),
                             "dropped": float(np.mean([r.dropped / max(1, r.offered) for r in runs])),
                             "mean_batch": float(np.mean([r.batched / max(1, r.batches) for r in runs])),
                             "decision_ms": 1000.0 * sum(r.decide_s for r in runs) / max(1, sum(r.batches for r in runs))})
    return rows


def ratios(rows: list[dict]) -> dict[float, list[float]]:
    """Per SLO multiplier, ORLOJ's finish rate over the best baseline's, one value per case."""
    cells: dict[tuple[str, float], dict[str, float]] = {}
    for r in rows:
        cells.setdefault((r["case"], r["slo_x"]), {})[r["policy"]] = r["finish_rate"]
    out: dict[float, list[float]] = {}
    for (_, m), by in cells.items():
        best = max((by[p] for p in BASELINES if p in by), default=None)
        if "orloj" in by and best:
            out.setdefault(m, []).append(by["orloj"] / best)
    return out


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """Simulate each named policy (default: the scenario's, else all four) on every case and SLO."""
    sc = load(scenario_path)
    chosen = [choose(p, "policy", list(POLICIES)) for p in (policies or sc.policies)]
    rows = sweep(sc, chosen)
    summary = {f"finish_rate_{p}": float(np.mean([r["finish_rate"] for r in rows if r["policy"] == p]))
               for p in chosen}
    for m, values in ratios(rows).items():
        summary[f"orloj_over_best_baseline_{m:g}x"] = float(np.mean(values))
    return SimulationReport("orloj", rows, summary)
