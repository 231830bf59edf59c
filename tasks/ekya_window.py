"""One Ekya retraining window inside the continuous-retraining flow: profile, decide, run, re-plan.

The window's clock is virtual (``RunSettings.window_s``): a retraining job on ``g`` GPUs deploys
its model ``gpu_seconds / g`` after it starts (the engine's EstimateAccuracy model, alpha = 1);
events are taken in that order, each as soon as its task has really finished
(``prefect.futures.as_completed``). A failed or cancelled job is handled at the virtual time the
flow learns of it (the last event). Between two events every stream's inference runs with a fixed
model and GPU share; each such period is one ``infer_segment`` task on that share. Jobs the
uniform baseline starts that cannot end in the window train for the epochs that fit and are
discarded (spec §8.11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefect.futures import PrefectFuture, as_completed

from gpu.schedulers.ekya import (EkyaDecision, EkyaParams, InferenceProfile, RetrainConfig, RunningRetrain,
                                 StreamState, infer_job, thief_schedule, train_job)
from gpu.schedulers.ekya_baselines import uniform_schedule
from gpu.schedulers.ekya_placement import to_gpu_requests
from gpu.schedulers.ekya_profiler import micro_profile, prune_configs
from tasks.ekya_tasks import (ConfigSpec, RetrainResult, SegmentResult, WindowProfile, WindowSettings,
                              bootstrap_model, config_grid, gpu_seconds, infer_segment, profile_window, retrain,
                              train_golden)
from tasks.requests import gpu_options
from tasks.streams import StreamSpec, inference_profile_points, make_streams


@dataclass(frozen=True)
class RunSettings:
    """Everything a flow run's windows need (validated by ``continuous_retraining``)."""

    policy: str
    streams: int
    windows: int
    window_s: float
    seed: int
    pool_gpus: int
    a_min: float
    delta: float
    full_rate_gpus: float
    uniform_config: str
    uniform_share: float
    profile_gpus: float
    fail_stream: str | None
    fail_window: int
    registry_prefix: str
    settings: WindowSettings
    experiment: str
    tracking_uri: str

    @property
    def params(self) -> EkyaParams:
        return EkyaParams(delta=self.delta, a_min=self.a_min)


@dataclass
class StreamRuntime:
    """Flow-side state of one stream across windows."""

    spec: StreamSpec
    model: dict  # deployed state dict
    version: str = "bootstrap"
    configs: tuple[ConfigSpec, ...] = ()  # survivors of pruning


@dataclass
class _Job:
    stream: str
    config: ConfigSpec
    predicted: RetrainConfig
    gpus: float
    start: float
    finish: float  # virtual end (may exceed the window: truncated, discarded)
    future: PrefectFuture | None
    outcome: str = "RUNNING"  # COMPLETED, FAILED, CANCELLED, CRASHED, DISCARDED
    result: RetrainResult | None = None


@dataclass
class WindowResult:
    """What one window did and measured (per stream unless noted)."""

    window: int
    measured: dict[str, float]
    predicted: dict[str, float]  # the window-start decision's expected accuracy
    configs: dict[str, str | None]
    start_alloc: dict[str, float]
    profiles: dict[str, WindowProfile]
    predicted_configs: dict[str, dict[str, RetrainConfig]]
    jobs: list[_Job]
    failures: list[str]
    events: list[dict] = field(default_factory=list)
    segments: list[tuple[str, float, float, float, SegmentResult]] = field(default_factory=list)  # stream, t0, t1, gpus

    @property
    def mean_measured(self) -> float:
        return sum(self.measured.values()) / len(self.measured)


def start_streams(run: RunSettings) -> tuple[str, list[StreamRuntime]]:
    """Golden model once (its checkpoint path), then every stream's first model on its undrifted history."""
    golden = train_golden.submit(run.seed)
    specs = make_streams(run.streams, run.seed)
    futures = [bootstrap_model.submit(s, run.settings) for s in specs]
    grid = config_grid()
    configs = tuple(c for c in grid if c.name == run.uniform_config) if run.policy == "uniform" else grid
    return golden.result(), [StreamRuntime(s, f.result(), configs=configs) for s, f in zip(specs, futures)]


def _predict(profile: WindowProfile, configs: tuple[ConfigSpec, ...], settings: WindowSettings) -> dict[str, RetrainConfig]:
    """Micro-profiler fit per config; if a curve cannot be fitted, the best accuracy observed."""
    out = {}
    for obs in profile.observations:
        try:
            out[obs.config] = micro_profile(obs, start_accuracy=profile.current_accuracy)
        except (RuntimeError, ValueError):
            cfg = next(c for c in configs if c.name == obs.config)
            out[obs.config] = RetrainConfig(obs.config, max(obs.accuracies), gpu_seconds(cfg, settings))
    return out


class _Window:
    """The event loop of one window (mutable; lives only inside ``run_window``)."""

    def __init__(self, run: RunSettings, w: int, streams: list[StreamRuntime], profile: InferenceProfile,
                 profiles: dict[str, WindowProfile], predicted: dict[str, dict[str, RetrainConfig]]):
        self.run, self.w, self.streams, self.profile = run, w, {s.spec.name: s for s in streams}, profile
        self.profiles, self.predicted = profiles, predicted
        self.accuracy = {n: p.current_accuracy for n, p in profiles.items()}  # deployed model, golden labels
        self.infer: dict[str, float] = {}
        self.jobs: dict[str, _Job] = {}
        self.t = 0.0
        self.open: dict[str, tuple[float, float, int | None]] = {}  # stream -> (start, gpus, model id)
        self.models: dict[str, dict] = {}
        self.segments: list[tuple[str, float, float, float, PrefectFuture | SegmentResult]] = []
        self.events: list[dict] = []

    def requests(self, alloc: dict[str, float]) -> dict[str, float]:
        """GPUs each job can hold on the pool's devices (packing may shrink a fraction)."""
        held = {train_job(j.stream): j.gpus for j in self.running()}
        full = {**held, **alloc}
        total = sum(full.values())
        scale = min(1.0, self.run.pool_gpus / total) if total > 0 else 1.0
        shares = {job: g * scale / self.run.pool_gpus for job, g in full.items()}
        return {r.job: r.gpus for r in to_gpu_requests(shares, self.run.pool_gpus) if r.job in alloc}

    def running(self) -> list[_Job]:
        return [j for j in self.jobs.values() if j.outcome == "RUNNING"]

    def apply(self, decision: EkyaDecision, kind: str) -> None:
        alloc = {job: g for job, g in decision.allocation().items()}
        got = self.requests(alloc)
        for d in decision.streams:
            self.infer[d.stream] = got.get(infer_job(d.stream), 0.0)
            if d.config is not None and got.get(train_job(d.stream), 0.0) > 0:
                self.start_job(d.stream, d.config, got[train_job(d.stream)])
        self.close_segments(self.t)
        self.open_segments()
        self.events.append({"t": round(self.t, 3), "event": kind, "allocation": {**got}})

    def start_job(self, name: str, config_name: str, gpus: float) -> None:
        stream = self.streams[name]
        cfg = next(c for c in stream.configs if c.name == config_name)
        duration = gpu_seconds(cfg, self.run.settings) / gpus
        finish = self.t + duration
        epochs = cfg.epochs if finish <= self.run.window_s else math.floor(cfg.epochs * (self.run.window_s - self.t) / duration)
        job = _Job(name, cfg, self.predicted[name][config_name], gpus, self.t, finish, None)
        self.jobs[name] = job
        if epochs < 1:  # holds its GPUs to the window end without finishing an epoch
            job.outcome = "DISCARDED"
            return
        fail = name == self.run.fail_stream and self.w == self.run.fail_window
        with gpu_options(gpus=gpus, label=f"retrain {name}"):  # the lease's name on the occupancy chart
            job.future = retrain.submit(stream.spec, self.w, stream.model, self.profiles[name].golden_labels, cfg,
                                        self.run.settings, epochs=epochs, fail=fail)

    def close_segments(self, t: float, only_changed: bool = True) -> None:
        """End the inference periods that change at ``t`` (all of them at the window end).

        A stream's period lasts while its model and inference share stay the same; it is served
        by one ``infer_segment`` task on that share, over the live frames of the period.
        """
        n = self.run.settings.frames
        for name, stream in self.streams.items():
            t0, gpus, model = self.open.get(name, (0.0, 0.0, None))
            if only_changed and (gpus, model) == (self.infer.get(name, 0.0), id(stream.model)) or model is None:
                continue
            first, last = round(t0 / self.run.window_s * n), round(t / self.run.window_s * n)
            if last > first:
                rate = self.profile.frame_rate(gpus)
                if rate <= 0:  # not served: every frame of the period counts as wrong
                    result: PrefectFuture | SegmentResult = SegmentResult(name, first, last - first, 0, 0)
                else:
                    with gpu_options(gpus=gpus, label=f"infer {name}"):
                        result = infer_segment.submit(stream.spec, self.w, self.models[name], first, last, rate,
                                                      self.run.settings)
                self.segments.append((name, t0, t, gpus, result))
            del self.open[name]

    def open_segments(self) -> None:
        """Start a period for every stream whose previous one was just closed."""
        for name, stream in self.streams.items():
            if name not in self.open:
                self.open[name] = (self.t, self.infer.get(name, 0.0), id(stream.model))
                self.models[name] = stream.model

    def replan(self, kind: str) -> None:
        """Re-invoke the scheduler for the rest of the window (uniform: freed GPUs stay with the stream)."""
        if self.run.policy != "thief" or self.t >= self.run.window_s:
            self.close_segments(self.t)
            self.open_segments()
            self.events.append({"t": round(self.t, 3), "event": kind, "allocation": dict(self.infer)})
            return
        states, start = [], {}
        for name in self.streams:
            job = self.jobs.get(name)
            start[infer_job(name)] = self.infer[name]
            if job is not None and job.outcome == "RUNNING":
                running = RunningRetrain(job.config.name, job.predicted.accuracy, job.finish - self.t, job.gpus)
                states.append(StreamState(name, self.accuracy[name], (), self.profile, running))
            elif job is None:
                states.append(StreamState(name, self.accuracy[name], tuple(self.predicted[name].values()), self.profile))
                start[train_job(name)] = 0.0
            else:
                states.append(StreamState(name, self.accuracy[name], (), self.profile))
        free = max(0.0, self.run.pool_gpus - sum(j.gpus for j in self.running()))
        scale = min(1.0, free / sum(start.values())) if sum(start.values()) > 0 else 1.0
        decision = thief_schedule(states, free, self.run.window_s - self.t, self.run.params,
                                  start={k: v * scale for k, v in start.items()})
        self.apply(decision, kind)

    def finish_job(self, job: _Job, t: float) -> None:
        """A retraining ended at virtual ``t``: deploy its model if better, free its GPUs, re-plan."""
        state = job.future.state
        self.t = max(self.t, t)
        job.outcome = state.type.value if not state.is_completed() else "COMPLETED"
        if job.outcome == "COMPLETED":
            job.result = state.result()
            stream = self.streams[job.stream]
            if job.result.val_accuracy >= self.accuracy[job.stream]:
                stream.model, stream.version = job.result.state, f"w{self.w}-{job.config.name}"
                self.accuracy[job.stream] = job.result.val_accuracy
        self.infer[job.stream] = self.infer.get(job.stream, 0.0) + job.gpus
        self.replan(f"{job.stream} retraining {job.outcome.lower()}")

    def loop(self) -> None:
        """Take retraining completions in virtual-time order, failures as soon as they are seen."""
        done: set[str] = set()
        while True:
            live = [j for j in self.running() if j.future is not None]
            failed = [j for j in live if j.stream in done and not j.future.state.is_completed()]
            if failed:
                self.finish_job(failed[0], self.t)
                continue
            due = [j for j in live if j.finish <= self.run.window_s]
            if not due:
                return
            head = min(due, key=lambda j: (j.finish, j.stream))
            if head.stream in done:
                self.finish_job(head, head.finish)
                continue
            waiting = {j.future: j for j in live if j.stream not in done}
            finished = next(iter(as_completed(list(waiting))))
            finished.wait()
            done.add(waiting[finished].stream)

    def end(self) -> list[tuple[str, float, float, float, SegmentResult]]:
        """Close the last period, let jobs that cannot finish run out, collect the measurements."""
        self.close_segments(self.run.window_s, only_changed=False)
        for job in self.running():
            if job.future is not None:
                job.future.wait()
                state = job.future.state
                job.outcome = "DISCARDED" if state.is_completed() else state.type.value
        return [(n, t0, t1, g, r if isinstance(r, SegmentResult) else r.result()) for n, t0, t1, g, r in self.segments]


def run_window(run: RunSettings, w: int, streams: list[StreamRuntime], golden: str) -> WindowResult:
    """Profile, decide, retrain and serve one window; ``streams`` is updated in place."""
    with gpu_options(gpus=run.profile_gpus):
        futures = {s.spec.name: profile_window.submit(s.spec, w, s.model, golden, s.configs, run.settings)
                   for s in streams}
    profiles = {n: f.result() for n, f in futures.items()}
    predicted = {s.spec.name: _predict(profiles[s.spec.name], s.configs, run.settings) for s in streams}
    if run.policy == "thief" and w % 2 == 1:  # prune every 2 windows (spec §3.4.5, §8.13)
        for s in streams:
            keep = {c.name for c in prune_configs(list(predicted[s.spec.name].values()))}
            s.configs = tuple(c for c in s.configs if c.name in keep)
            predicted[s.spec.name] = {n: c for n, c in predicted[s.spec.name].items() if n in keep}
    profile = InferenceProfile(run.full_rate_gpus, inference_profile_points(streams[0].spec.persistence))
    states = [StreamState(s.spec.name, profiles[s.spec.name].current_accuracy,
                          tuple(predicted[s.spec.name].values()), profile) for s in streams]
    if run.policy == "thief":
        decision = thief_schedule(states, run.pool_gpus, run.window_s, run.params)
    else:
        decision = uniform_schedule(states, run.pool_gpus, run.window_s, run.uniform_config, run.uniform_share,
                                    run.params)
    window = _Window(run, w, streams, profile, profiles, predicted)
    window.apply(decision, "window start")
    window.loop()
    segments = window.end()
    measured = {}
    for s in streams:
        mine = [seg for n, _, _, _, seg in segments if n == s.spec.name]
        measured[s.spec.name] = sum(x.correct for x in mine) / max(1, sum(x.frames for x in mine))
    jobs = list(window.jobs.values())
    return WindowResult(w, measured, {d.stream: d.expected_accuracy for d in decision.streams},
                        {d.stream: d.config for d in decision.streams}, dict(window.events[0]["allocation"]),
                        profiles, predicted, jobs, [j.stream for j in jobs if j.outcome in ("FAILED", "CANCELLED", "CRASHED")],
                        window.events, segments)

