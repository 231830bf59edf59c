"""One Ekya retraining window inside the continuous-retraining flow: profile, decide, run, re-plan.

The decisions are ``gpu.schedulers.ekya.controller.EkyaController``'s, the object the simulator drives
too; this module is the *measured* world that feeds it. Every outcome comes from the torch work on its
slice (``tasks.runtime.slices.on_slice``): the micro-profiler's epoch costs (so the scheduler's cost estimate
for a config is measured, not a formula), each retraining's duration, and the frame rate each
inference share sustains.

The window's timeline is in **slice seconds** (``RunSettings.window_s``): the time the measured work
takes on the slice the task held (on a simulated pool: the work's CPU time divided by the share). A
retraining job started at ``t`` deploys at ``t + slice_s`` of its measured run; one that would end
after the window stops there (its model is discarded). Slice time is independent of how loaded the
machine is and a window of a second or less holds the whole toy workload, so tests stay short.

Events are taken in slice-time order: when jobs are running the loop waits for all of them to have
really finished (``prefect.futures.as_completed``), then hands the earliest to the controller, whose
re-invocation may start new jobs at that instant. A failed or cancelled job is handed over at the
current time. Between two events every stream's inference runs with a fixed model and GPU share; each
such period is one ``infer_segment`` task on that share. With ``executor="salus"`` the jobs of each device
are co-located Salus jobs in one lane instead (``tasks.ekya.salus``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from prefect.futures import PrefectFuture, as_completed

from gpu.schedulers.ekya.thief import EkyaParams, InferenceProfile, RetrainConfig, StreamState, infer_job, train_job
from gpu.schedulers.ekya.controller import EkyaController, EkyaStep, RetrainStart
from gpu.schedulers.ekya.placement import to_gpu_requests
from gpu.schedulers.ekya.policies import make_policy
from gpu.schedulers.ekya.profiler import micro_profile, profiled_gpu_seconds, prune_configs
from tasks.ekya.salus import EkyaLanes, LaneReport, PeriodAnswers
from tasks.ekya.work import (ConfigSpec, RetrainResult, SegmentResult, WindowProfile, WindowSettings,
                              bootstrap_model, config_grid, infer_frames, infer_segment, profile_window, retrain,
                              train_golden)
from tasks.runtime.requests import gpu_options
from tasks.ekya.streams import StreamSpec, inference_profile_points, make_streams

_FAILED = ("FAILED", "CANCELLED", "CRASHED")


@dataclass(frozen=True)
class RunSettings:
    """Everything a flow run's windows need (validated by ``continuous_retraining``)."""

    policy: str  # as the user named it (labels, MLflow tags)
    scheduler: str  # the Ekya policy it stands for (``gpu.schedulers.ekya.policies``)
    streams: int
    windows: int
    window_s: float  # slice seconds per window
    seed: int
    pool_gpus: int
    a_min: float
    delta: float
    profile_gpus: float
    fail_stream: str | None
    fail_window: int
    registry_prefix: str
    settings: WindowSettings
    experiment: str
    tracking_uri: str
    objects_per_frame: dict[str, int] = field(default_factory=dict)  # stream -> training samples per frame
    executor: str = "slices"  # "salus": each device's jobs co-located in one Salus lane (``tasks.ekya.salus``)
    device_mb: tuple[float, ...] = ()  # the pool's devices' memory, by index (Salus lanes)

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
    predicted: RetrainConfig  # the micro-profiler's accuracy and GPU-seconds
    gpus: float
    start: float
    expected_s: float  # the controller's predicted duration on ``gpus``
    future: PrefectFuture | None
    outcome: str = "RUNNING"  # COMPLETED, FAILED, CANCELLED, CRASHED, DISCARDED
    result: RetrainResult | None = None
    observed: str | None = None  # the task's final state once seen (handed to the controller in slice-time order)

    @property
    def measured_s(self) -> float | None:
        """The measured duration on its slice (None until it has run)."""
        return None if self.result is None else self.result.slice_s


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
    lanes: LaneReport | None = None  # executor "salus": what the device executors measured

    @property
    def mean_measured(self) -> float:
        return sum(self.measured.values()) / len(self.measured)


def make_controller(run: RunSettings) -> EkyaController:
    """The run's controller: its policy over the flow's config grid and the pool's GPUs."""
    return EkyaController(make_policy(run.scheduler, config_grid(), run.params), run.pool_gpus)


def start_streams(run: RunSettings, controller: EkyaController) -> tuple[str, list[StreamRuntime]]:
    """Golden model once (its checkpoint path), then every stream's first model on its undrifted history.

    A policy with one fixed config profiles only that config; ``noretrain`` profiles none.
    """
    golden = train_golden.submit(run.seed)
    specs = [replace(s, objects_per_frame=run.objects_per_frame.get(s.name, 1)) for s in make_streams(run.streams, run.seed)]
    futures = [bootstrap_model.submit(s, run.settings) for s in specs]
    rule = controller.rule
    configs = tuple(c for c in config_grid() if rule.retrains and rule.config in (None, c.name))
    return golden.result(), [StreamRuntime(s, f.result(), configs=configs) for s, f in zip(specs, futures)]


def _predict(profile: WindowProfile) -> dict[str, RetrainConfig]:
    """Micro-profiler fit per config; if a curve cannot be fitted, the best accuracy observed. Costs are
    the measured epoch costs either way."""
    out = {}
    for obs in profile.observations:
        try:
            out[obs.config] = micro_profile(obs, start_accuracy=profile.current_accuracy)
        except (RuntimeError, ValueError):
            out[obs.config] = RetrainConfig(obs.config, max(obs.accuracies), profiled_gpu_seconds(obs))
    return out


def inference_profile(profile: WindowProfile, spec: StreamSpec, run: RunSettings) -> InferenceProfile:
    """The stream's inference configs from measurement: the live frame rate needs ``frame_gpu_s`` GPU-seconds
    per frame times ``frames / window_s`` frames per slice second of one GPU."""
    full_rate = max(1e-6, profile.frame_gpu_s * run.settings.frames / run.window_s)
    return InferenceProfile(full_rate, inference_profile_points(spec.persistence))


class _Window:
    """The event loop of one window (mutable; lives only inside ``run_window``)."""

    def __init__(self, run: RunSettings, w: int, streams: list[StreamRuntime], controller: EkyaController,
                 profiles: dict[str, WindowProfile], predicted: dict[str, dict[str, RetrainConfig]]):
        self.run, self.w, self.streams, self.controller = run, w, {s.spec.name: s for s in streams}, controller
        self.profiles, self.predicted = profiles, predicted
        self.accuracy = {n: p.current_accuracy for n, p in profiles.items()}  # deployed model, golden labels
        self.infer: dict[str, float] = {}
        self.jobs: dict[str, _Job] = {}
        self.t = 0.0
        self.open: dict[str, tuple[float, float, int | None]] = {}  # stream -> (start, gpus, model id)
        self.models: dict[str, dict] = {}
        self.segments: list[tuple[str, float, float, float, PrefectFuture | PeriodAnswers | SegmentResult]] = []
        self.events: list[dict] = []
        self.devices: dict[str, tuple[int, ...]] = {}  # job -> the devices Ekya's plan put it on
        self.lanes = EkyaLanes(run.device_mb, run.settings) if run.executor == "salus" else None
        self.serving: dict[str, PrefectFuture] = {}  # stream -> its open period's Salus inference job

    def requests(self, step: EkyaStep) -> dict[str, float]:
        """GPUs each job can hold on the pool's devices (packing may shrink a fraction)."""
        full = {**step.allocation(), **{train_job(j.stream): j.gpus for j in self.running()}}
        total = sum(full.values())
        scale = min(1.0, self.run.pool_gpus / total) if total > 0 else 1.0
        shares = {job: g * scale / self.run.pool_gpus for job, g in full.items()}
        planned = to_gpu_requests(shares, self.run.pool_gpus)
        self.devices.update({r.job: r.devices for r in planned})
        return {r.job: r.gpus for r in planned}

    def submit(self, task, job: str, gpus: float, label: str, *args, **kwargs) -> PrefectFuture:
        """Submit Ekya job ``job``'s task on ``gpus``: a slice of its own, or a Salus job in its device's lane."""
        if self.lanes is not None:
            return self.lanes.submit(task, job, self.devices[job], gpus, label, *args, **kwargs)
        with gpu_options(gpus=gpus, label=label):  # the lease's name on the occupancy chart
            return task.submit(*args, **kwargs)

    def running(self) -> list[_Job]:
        return [j for j in self.jobs.values() if j.outcome == "RUNNING"]

    def apply(self, step: EkyaStep, kind: str) -> None:
        got = self.requests(step)
        self.infer = {s: got.get(infer_job(s), 0.0) for s in step.infer}
        for start in step.starts:
            self.start_job(start, got.get(train_job(start.stream), 0.0))
        self.close_segments(self.t)
        self.open_segments()
        self.events.append({"t": round(self.t, 6), "event": kind, "allocation": {
            **{infer_job(s): g for s, g in self.infer.items()}, **{train_job(j.stream): j.gpus for j in self.running()}}})

    def start_job(self, start: RetrainStart, gpus: float) -> None:
        stream = self.streams[start.stream]
        cfg = next(c for c in stream.configs if c.name == start.config)
        job = _Job(start.stream, cfg, self.predicted[start.stream][start.config], gpus, self.t, start.expected_s, None)
        self.jobs[start.stream] = job
        if gpus <= 0:  # the devices could not hold it: it never runs
            job.outcome = "DISCARDED"
            return
        fail = start.stream == self.run.fail_stream and self.w == self.run.fail_window
        job.future = self.submit(retrain, train_job(start.stream), gpus, f"retrain {start.stream}", stream.spec, self.w,
                                 stream.model, self.profiles[start.stream].golden_labels, cfg, self.run.settings,
                                 budget_s=self.run.window_s - self.t, fail=fail)

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
                if gpus <= 0:  # not served: every frame of the period counts as wrong
                    result: PrefectFuture | PeriodAnswers | SegmentResult = SegmentResult(name, first, last - first, 0, 0)
                elif self.lanes is not None:  # its Salus job has been serving since the period opened
                    result = PeriodAnswers(self.serving.pop(name), last, t - t0)
                else:
                    result = self.submit(infer_segment, infer_job(name), gpus, f"infer {name}", stream.spec, self.w,
                                         self.models[name], first, last, t - t0, self.run.settings)
                self.segments.append((name, t0, t, gpus, result))
            del self.open[name]

    def open_segments(self) -> None:
        """Start a period for every stream whose previous one was just closed."""
        for name, stream in self.streams.items():
            if name not in self.open:
                self.open[name] = (self.t, self.infer.get(name, 0.0), id(stream.model))
                self.models[name] = stream.model
                if self.lanes is not None and self.infer.get(name, 0.0) > 0:
                    first = round(self.t / self.run.window_s * self.run.settings.frames)
                    self.serving[name] = self.submit(infer_frames, infer_job(name), self.infer[name], f"infer {name}",
                                                     stream.spec, self.w, stream.model, first, self.run.settings)

    def finish_job(self, job: _Job, t: float) -> None:
        """A retraining ended at slice time ``t``: deploy its model if better, then ask the controller."""
        self.t = max(self.t, t)
        if job.outcome == "COMPLETED":
            stream = self.streams[job.stream]
            if job.result.val_accuracy >= self.accuracy[job.stream]:
                stream.model, stream.version = job.result.state, f"w{self.w}-{job.config.name}"
                self.accuracy[job.stream] = job.result.val_accuracy
        step = self.controller.on_job_done(self.t, job.stream, self.accuracy[job.stream])
        self.apply(step, f"{job.stream} retraining {job.outcome.lower()}")

    def loop(self) -> None:
        """Hand retraining ends to the controller in slice-time order, failures at once."""
        while True:
            live = [j for j in self.running() if j.future is not None]
            if not live:
                return
            for future in as_completed([j.future for j in live]):
                future.wait()
            for job in live:
                if job.observed is None:
                    state = job.future.state
                    job.observed = "COMPLETED" if state.is_completed() else state.type.value
                    job.result = state.result() if state.is_completed() else None
            failed = [j for j in live if j.observed in _FAILED]
            if failed:
                job = min(failed, key=lambda j: j.stream)
                job.outcome = job.observed
                self.finish_job(job, self.t)
                continue
            head = min(live, key=lambda j: (j.start + j.result.slice_s, j.stream))
            if not head.result.complete:  # the earliest end is past the window: nothing more happens in it
                return
            head.outcome = "COMPLETED"
            self.finish_job(head, head.start + head.result.slice_s)

    def end(self) -> list[tuple[str, float, float, float, SegmentResult]]:
        """Close the last period, mark jobs the window cut short, collect the measurements."""
        self.close_segments(self.run.window_s, only_changed=False)
        for job in self.running():
            job.outcome = "DISCARDED" if job.observed in (None, "COMPLETED") else job.observed
        return [(n, t0, t1, g, r if isinstance(r, SegmentResult) else r.result()) for n, t0, t1, g, r in self.segments]


def run_window(run: RunSettings, w: int, streams: list[StreamRuntime], golden: str,
               controller: EkyaController) -> WindowResult:
    """Profile, decide, retrain and serve one window; ``streams`` is updated in place."""
    with gpu_options(gpus=run.profile_gpus):
        futures = {s.spec.name: profile_window.submit(s.spec, w, s.model, golden, s.configs, run.settings)
                   for s in streams}
    profiles = {n: f.result() for n, f in futures.items()}
    predicted = {s.spec.name: _predict(profiles[s.spec.name]) for s in streams}
    if controller.rule.picks_configs and w % 2 == 1:  # prune every 2 windows (thesis §2.4, "Micro-profiler")
        for s in streams:
            keep = {c.name for c in prune_configs(list(predicted[s.spec.name].values()))}
            s.configs = tuple(c for c in s.configs if c.name in keep)
            predicted[s.spec.name] = {n: c for n, c in predicted[s.spec.name].items() if n in keep}
    states = [StreamState(s.spec.name, profiles[s.spec.name].current_accuracy, tuple(predicted[s.spec.name].values()),
                          inference_profile(profiles[s.spec.name], s.spec, run)) for s in streams]
    window = _Window(run, w, streams, controller, profiles, predicted)
    try:
        step = controller.on_window_start(0.0, states, run.window_s)
        window.apply(step, "window start")
        window.loop()
        segments = window.end()
    finally:
        lanes = window.lanes.close() if window.lanes is not None else None
    measured = {}
    for s in streams:
        mine = [seg for n, _, _, _, seg in segments if n == s.spec.name]
        measured[s.spec.name] = sum(x.correct for x in mine) / max(1, sum(x.frames for x in mine))
    jobs = list(window.jobs.values())
    decision = step.decision
    return WindowResult(w, measured, {d.stream: d.expected_accuracy for d in decision.streams},
                        {d.stream: d.config for d in decision.streams}, dict(window.events[0]["allocation"]),
                        profiles, predicted, jobs, [j.stream for j in jobs if j.outcome in _FAILED],
                        window.events, segments, lanes)
