"""Ekya's window controller: one decision loop for the simulator and the continuous-retraining flow.

Paper: Ekya thesis Chapter 2, §2.4. Allocations change only at a retraining window's start and when a
retraining job completes: the thief (and Ekya-FixedConfig) is then re-invoked over the free GPUs, the
inference jobs and the streams that have not retrained yet, while running retraining jobs keep their
GPUs (Ekya "does not change allocations to jobs during the retraining", §2.1); the static baselines
(uniform, FixedRes, no-retraining) give the freed GPUs to the stream's own inference.

The controller follows ``gpu.contract.Controller``: it never reads a clock. A *world* calls

- ``on_window_start(now, streams, window_end)`` with every stream's state (deployed-model accuracy,
  profiled retraining configs with their accuracy and cost, inference profile), and
- ``on_job_done(now, stream, accuracy)`` when a retraining the controller started has ended (completed,
  failed or cancelled), with the accuracy of the model that serves the stream from now on,

and applies the returned ``EkyaStep``: every stream's inference GPUs and the retraining jobs to start.
The simulator (``gpu.sim.ekya.run``) feeds it modelled outcomes (a job ends ``retrain_s`` after it starts and
reaches its profiled accuracy); the flow (``tasks.ekya.window``) feeds it what the torch work measured.

Between events the controller only knows its own predictions: a running job's remaining time is the
prediction made when it started (``RunningRetrain``), never a measurement the world has not reported.

Example (Table 2.1's stream B alone on one GPU)::

    >>> c = EkyaController(make_policy("thief", ["cfg2"]), gpus=1.0)
    >>> b = StreamState("B", 0.55, (RetrainConfig("cfg2", 0.75, 40.0),))
    >>> step = c.on_window_start(0.0, [b], window_end=120.0)
    >>> [(s.stream, s.config) for s in step.starts], step.decision is not None
    ([('B', 'cfg2')], True)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from gpu.errors import ConfigError
from gpu.schedulers.ekya.thief import EkyaDecision, RetrainConfig, RunningRetrain, StreamState, infer_job, train_job
from gpu.schedulers.ekya.policies import EkyaPolicy, make_policy

__all__ = ["EkyaController", "EkyaStep", "RetrainStart", "make_policy"]


@dataclass(frozen=True)
class RetrainStart:
    """A retraining job to launch now: ``config`` on ``gpus``, predicted to deploy ``expected_s`` later."""

    stream: str
    config: str
    accuracy: float  # the profiled accuracy the scheduler expects
    gpus: float
    expected_s: float


@dataclass(frozen=True)
class EkyaStep:
    """What the world applies after a hook.

    ``infer`` is every stream's inference GPUs from now on; ``starts`` the retraining jobs to launch;
    ``decision`` the policy's ``EkyaDecision`` when it was invoked (None when a static policy only
    returned a finished job's GPUs to its stream's inference). ``allocation()`` also lists running jobs,
    e.g. ``{"A/infer": 0.9, "A/train": 0.6, "B/infer": 0.5}``.
    """

    now: float
    infer: Mapping[str, float]
    starts: tuple[RetrainStart, ...]
    running: Mapping[str, float]  # stream -> GPUs of every retraining job running after this step
    decision: EkyaDecision | None

    def allocation(self) -> dict[str, float]:
        """Job id -> GPUs after this step (inference and running retraining)."""
        return {**{infer_job(s): g for s, g in self.infer.items()}, **{train_job(s): g for s, g in self.running.items()}}


@dataclass(frozen=True)
class _Running:
    config: str
    accuracy: float
    gpus: float
    done_at: float  # predicted


class EkyaController:
    """One Ekya policy over a pool of ``gpus`` GPUs, window by window (see module docstring).

    Args:
        policy: an ``EkyaPolicy`` (``make_policy(name, configs, params)``).
        gpus: GPUs in the pool (fractions allowed).
    """

    system = "ekya"
    hooks = ("on_window_start", "on_job_done")

    def __init__(self, policy: EkyaPolicy, gpus: float):
        if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not gpus > 0:
            raise ConfigError("gpus", gpus, "must be a number > 0")
        self.rule, self.policy, self.gpus = policy, policy.name, float(gpus)
        self.window_end = 0.0
        self.streams: dict[str, StreamState] = {}
        self.infer: dict[str, float] = {}
        self.running: dict[str, _Running] = {}
        self.retrained: set[str] = set()

    def on_window_start(self, now: float, streams: Sequence[StreamState], window_end: float) -> EkyaStep:
        """A window begins: forget the last one and run the policy over the whole pool."""
        if not window_end > now:
            raise ConfigError("window_end", window_end, f"must be after now={now}")
        self.window_end, self.running, self.retrained = float(window_end), {}, set()
        self.streams = {s.name: replace(s, running=None) for s in streams}
        self.infer = {s.name: 0.0 for s in streams}
        decision = self.rule.decide(list(self.streams.values()), self.gpus, self.window_end - now, None)
        return self._apply(now, decision)

    def on_job_done(self, now: float, stream: str, accuracy: float) -> EkyaStep:
        """A retraining ended; ``accuracy`` is the model serving ``stream`` from now on.

        Its GPUs return to the stream's inference; the thief and FixedConfig are then re-invoked over the
        free GPUs for the rest of the window, starting from the current allocation (§2.4).
        """
        if stream not in self.running:
            raise ConfigError("stream", stream, f"has no running retraining (running: {sorted(self.running)})")
        job = self.running.pop(stream)
        self.retrained.add(stream)
        self.streams[stream] = replace(self.streams[stream], accuracy=float(accuracy))
        self.infer[stream] += job.gpus
        if not self.rule.reinvoke or now >= self.window_end:
            return self._step(now, (), None)
        free = max(0.0, self.gpus - sum(j.gpus for j in self.running.values()))
        start = {infer_job(s): g for s, g in self.infer.items()}
        total = sum(start.values())
        if total > free + 1e-6:  # only when a world granted less than it was told: keep the seed inside the pool
            start = {job: g * free / total for job, g in start.items()}
        decision = self.rule.decide(self._states(now), free, self.window_end - now, start)
        return self._apply(now, decision)

    def _states(self, now: float) -> list[StreamState]:
        """Streams as a re-invocation sees them: running jobs keep their GPUs, retrained streams have no configs."""
        out = []
        for name, s in self.streams.items():
            job = self.running.get(name)
            if job is not None:
                out.append(replace(s, configs=(), running=RunningRetrain(job.config, job.accuracy, job.done_at - now,
                                                                         job.gpus)))
            elif name in self.retrained:
                out.append(replace(s, configs=()))
            else:
                out.append(s)
        return out

    def _apply(self, now: float, decision: EkyaDecision) -> EkyaStep:
        starts = []
        for sd in decision.streams:
            self.infer[sd.stream] = sd.infer_gpus
            if sd.config is not None and sd.stream not in self.running:
                cfg = _config(self.streams[sd.stream], sd.config)
                self.running[sd.stream] = _Running(sd.config, cfg.accuracy, sd.retrain_gpus, now + sd.retrain_s)
                starts.append(RetrainStart(sd.stream, sd.config, cfg.accuracy, sd.retrain_gpus, sd.retrain_s))
        return self._step(now, tuple(starts), decision)

    def _step(self, now: float, starts: tuple[RetrainStart, ...], decision: EkyaDecision | None) -> EkyaStep:
        return EkyaStep(now, dict(self.infer), starts, {s: j.gpus for s, j in self.running.items()}, decision)


def _config(stream: StreamState, name: str) -> RetrainConfig:
    return next(c for c in stream.configs if c.name == name)
