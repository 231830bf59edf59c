"""Trace-driven simulator for Ekya (thesis §2.5): policies retrain and serve streams window by window.

Time advances on ``gpu.sim.events.EventLoop``; the decisions are ``EkyaController``'s (the same object the
continuous-retraining flow drives), fed with modelled outcomes: a retraining job ends exactly
``retrain_s`` after it starts (the scheduler's prediction) and its model reaches the config's profiled
accuracy. A retraining unfinished at the window end is discarded (the paper does not say; docs/ekya.md).
The metric is the paper's: instantaneous inference accuracy averaged over time, then over streams and
windows. Policy names: ``gpu.schedulers.ekya.policies``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from gpu.report import SimulationReport
from gpu.schedulers.ekya.thief import EkyaDecision, StreamState
from gpu.schedulers.ekya.controller import EkyaController, EkyaStep
from gpu.schedulers.ekya.policies import EkyaPolicy, check_policies, make_policy
from gpu.sim.ekya.scenario import EkyaScenario, load
from gpu.sim.events import EventLoop

_EPS = 1e-9


@dataclass
class PolicyResult:
    """What one policy achieved: accuracy per (window, stream), a_MIN violations, decisions."""

    policy: str
    accuracy: np.ndarray  # [window, stream] time-averaged inference accuracy
    min_accuracy: float
    below_amin_s: float
    peak_gpus: float
    retrainings: int
    decisions: list[tuple[int, float, EkyaDecision]] = field(default_factory=list)  # (window, time, decision)

    @property
    def mean_accuracy(self) -> float:
        return float(self.accuracy.mean())


class _Run:
    """One policy over one scenario; the event callbacks mutate only this object."""

    def __init__(self, sc: EkyaScenario, policy: EkyaPolicy):
        self.sc, self.loop = sc, EventLoop()
        self.controller = EkyaController(policy, sc.gpus)
        n = len(sc.streams)
        self.index = {s.name: i for i, s in enumerate(sc.streams)}
        self.model = [s.windows[0].start_accuracy for s in sc.streams]
        self.infer = [0.0] * n
        self.training: dict[int, tuple[float, float]] = {}  # stream -> (gpus, profiled accuracy)
        self.integral = np.zeros((sc.n_windows, n))
        self.window, self.last_t = 0, 0.0
        self.result = PolicyResult(policy.name, self.integral, 1.0, 0.0, 0.0, 0)

    def _advance(self) -> None:
        dt = self.loop.now - self.last_t
        if dt > 0:
            for i, s in enumerate(self.sc.streams):
                inst = self.model[i] * s.inference.relative_accuracy(self.infer[i])
                self.integral[self.window, i] += inst * dt
                self.result.min_accuracy = min(self.result.min_accuracy, inst)
                if inst < self.sc.params.a_min - _EPS:
                    self.result.below_amin_s += dt
        self.last_t = self.loop.now

    def _apply(self, step: EkyaStep) -> None:
        """The modelled world: each started job deploys ``expected_s`` later, if that is inside the window."""
        if step.decision is not None:
            self.result.decisions.append((self.window, self.loop.now, step.decision))
        for name, gpus in step.infer.items():
            self.infer[self.index[name]] = gpus
        window_end = (self.window + 1) * self.sc.window_s
        for start in step.starts:
            i = self.index[start.stream]
            self.training[i] = (start.gpus, start.accuracy)
            done = self.loop.now + start.expected_s
            if done < window_end - _EPS:
                self.loop.at(done, lambda i=i, w=self.window: self._complete(i, w), priority=1)
        if step.decision is not None:  # a static policy's completion only moves GPUs from training to inference
            used = sum(self.infer) + sum(t[0] for t in self.training.values())
            self.result.peak_gpus = max(self.result.peak_gpus, used)

    def _start_window(self, w: int) -> None:
        self._advance()
        self.window, self.training = w, {}
        states = []
        for i, s in enumerate(self.sc.streams):
            spec = s.windows[w]
            self.model[i] = spec.start_accuracy if w == 0 else max(spec.start_accuracy, self.model[i] - spec.drift)
            states.append(StreamState(s.name, self.model[i], spec.configs, s.inference))
        self._apply(self.controller.on_window_start(self.loop.now, states, (w + 1) * self.sc.window_s))

    def _complete(self, i: int, w: int) -> None:
        if w != self.window or i not in self.training:
            return
        self._advance()
        _, acc = self.training.pop(i)
        self.model[i] = max(self.model[i], acc)
        self.result.retrainings += 1
        self._apply(self.controller.on_job_done(self.loop.now, self.sc.streams[i].name, self.model[i]))

    def run(self) -> PolicyResult:
        for w in range(self.sc.n_windows):
            self.loop.at(w * self.sc.window_s, lambda w=w: self._start_window(w), priority=0)
        self.loop.run(until=self.sc.n_windows * self.sc.window_s)
        self._advance()
        self.result.accuracy = self.integral / self.sc.window_s
        return self.result


def simulate_policy(scenario: EkyaScenario, policy: str | EkyaPolicy) -> PolicyResult:
    """Run one policy (a name, or an ``EkyaPolicy`` such as a thief fed perturbed profiles) over every
    window of ``scenario``."""
    return _Run(scenario, make_policy(policy, scenario) if isinstance(policy, str) else policy).run()


def simulate(scenario: EkyaScenario, policies: Sequence[str] | None = None) -> SimulationReport:
    """Run ``policies`` (default: the scenario's list) and tabulate mean accuracy per policy/stream/window."""
    names = list(policies or scenario.policies)
    results = [simulate_policy(scenario, name) for name in names]
    table, per_stream, per_window, decisions = [], [], [], []
    summary: dict[str, float] = {}
    for r in results:
        table.append({"policy": r.policy, "mean_accuracy": r.mean_accuracy, "min_accuracy": r.min_accuracy,
                      "below_amin_frac": r.below_amin_s / (scenario.n_windows * scenario.window_s * len(scenario.streams)),
                      "retrainings": r.retrainings, "peak_gpus": r.peak_gpus, "decisions": len(r.decisions)})
        summary[f"{r.policy}_mean_accuracy"] = r.mean_accuracy
        for i, s in enumerate(scenario.streams):
            per_stream.append({"policy": r.policy, "stream": s.name, "mean_accuracy": float(r.accuracy[:, i].mean())})
        for w in range(scenario.n_windows):
            per_window.append({"policy": r.policy, "window": w, "mean_accuracy": float(r.accuracy[w].mean())})
        for w, t, d in r.decisions:
            if t == w * scenario.window_s:
                decisions += [{"policy": r.policy, "window": w, "stream": sd.stream, "config": sd.config or "-",
                               "retrain_gpus": sd.retrain_gpus, "infer_gpus": sd.infer_gpus,
                               "expected_accuracy": sd.expected_accuracy} for sd in d.streams]
    uniform = [r.mean_accuracy for r in results if r.policy.startswith("uniform_")]
    if "thief_mean_accuracy" in summary and uniform:
        summary["thief_gain_over_best_uniform"] = summary["thief_mean_accuracy"] - max(uniform)
    return SimulationReport("ekya", table, summary, {"per_stream": per_stream, "per_window": per_window,
                                                     "window_start_decisions": decisions})


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """``gpuflows simulate ekya SCENARIO [--policy NAME ...]``: see docs/ekya.md for the format."""
    scenario = load(scenario_path)
    check_policies(policies or scenario.policies, scenario)  # fail on a bad name before simulating anything
    return simulate(scenario, policies)
