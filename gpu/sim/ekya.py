"""Trace-driven simulator for Ekya (thesis §2.5): policies retrain and serve streams window by window.

Time advances on ``gpu.sim.events.EventLoop``. Allocations change only at a window start and when a
retraining job completes (§2.4): the thief (and Ekya-FixedConfig) is then re-invoked over the free
GPUs, the inference jobs and the streams that have not retrained yet, while running retraining
jobs keep their GPUs (Ekya "does not change allocations to jobs during the retraining", §2.1); the
static baselines give the freed GPUs to the stream's own inference. A retraining unfinished at the
window end is discarded (the paper does not say; docs/ekya.md). The metric is the paper's:
instantaneous inference accuracy averaged over time, then over streams and windows.

Policies: ``thief`` (Algorithm 1 with the scenario's parameters), ``thief_start_splits`` (the same with
``start_splits`` on: per-stream splits also seed the search, not in Algorithm 1),
``uniform_<cfg>_<inference %>``, ``fixedres`` (Ekya-FixedRes, 50/50), ``fixedconfig_<cfg>``
(Ekya-FixedConfig) and ``noretrain``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.schedulers.ekya import EkyaDecision, RunningRetrain, StreamState, infer_job, thief_schedule
from gpu.schedulers.ekya_baselines import fixed_config_schedule, fixed_res_schedule, uniform_schedule
from gpu.sim.ekya_scenario import EkyaScenario, load
from gpu.sim.events import EventLoop

POLICY_FORMS = ("thief", "thief_start_splits", "noretrain", "fixedres", "uniform_<cfg>_<inference %>",
                "fixedconfig_<cfg>")
"""The policy names ``make_policy`` accepts (``<cfg>``: a retraining configuration of the scenario)."""

Decide = Callable[[Sequence[StreamState], float, float, Mapping[str, float] | None], EkyaDecision]
_EPS = 1e-9


@dataclass(frozen=True)
class Policy:
    """A named scheduler and what happens when a retraining job completes."""

    name: str
    decide: Decide
    reinvoke: bool  # True: re-run ``decide`` on completion; False: freed GPUs go to own inference


def make_policy(name: str, scenario: EkyaScenario) -> Policy:
    """Policy from its name (see module docstring); unknown names raise ConfigError('policy')."""
    p = scenario.params
    if name in ("thief", "thief_start_splits"):
        q = replace(p, start_splits=True) if name == "thief_start_splits" else p
        return Policy(name, lambda s, g, w, start=None: thief_schedule(s, g, w, q, start), True)
    if name == "noretrain":
        return Policy(name, lambda s, g, w, start=None: uniform_schedule(s, g, w, "", 1.0, p), False)
    if name == "fixedres":
        return Policy(name, lambda s, g, w, start=None: fixed_res_schedule(s, g, w, p), False)
    configs = {c.name for st in scenario.streams for win in st.windows for c in win.configs}
    m = re.fullmatch(r"uniform_(.+)_(\d+)", name)
    if m and m.group(1) in configs and 0 < int(m.group(2)) <= 100:
        cfg, share = m.group(1), int(m.group(2)) / 100
        return Policy(name, lambda s, g, w, start=None: uniform_schedule(s, g, w, cfg, share, p), False)
    m = re.fullmatch(r"fixedconfig_(.+)", name)
    if m and m.group(1) in configs:
        cfg = m.group(1)
        return Policy(name, lambda s, g, w, start=None: fixed_config_schedule(s, g, w, cfg, p, start), True)
    raise ConfigError("policy", name, "unknown; choose thief, thief_start_splits, noretrain, fixedres, uniform_<cfg>_<1-100> or "
                                      f"fixedconfig_<cfg> with <cfg> in {sorted(configs)}")


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

    def __init__(self, sc: EkyaScenario, policy: Policy):
        self.sc, self.policy, self.loop = sc, policy, EventLoop()
        n = len(sc.streams)
        self.model = [s.windows[0].start_accuracy for s in sc.streams]
        self.infer = [0.0] * n
        self.training: dict[int, tuple[float, float, str, float]] = {}  # stream -> (gpus, acc, cfg, done_at)
        self.retrained: set[int] = set()
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

    def _states(self, w: int, with_running: bool) -> list[StreamState]:
        out = []
        for i, s in enumerate(self.sc.streams):
            st = StreamState(s.name, self.model[i], s.windows[w].configs, s.inference)
            if i in self.training and with_running:
                gpus, acc, cfg, done = self.training[i]
                st = replace(st, configs=(), running=RunningRetrain(cfg, acc, done - self.loop.now, gpus))
            elif i in self.retrained or i in self.training:
                st = replace(st, configs=())
            out.append(st)
        return out

    def _apply(self, d: EkyaDecision, window_end: float) -> None:
        self.result.decisions.append((self.window, self.loop.now, d))
        for i, s in enumerate(self.sc.streams):
            sd = d.stream(s.name)
            self.infer[i] = sd.infer_gpus
            if sd.config is not None and i not in self.training:
                acc = next(c.accuracy for c in s.windows[self.window].configs if c.name == sd.config)
                done = self.loop.now + sd.retrain_s
                self.training[i] = (sd.retrain_gpus, acc, sd.config, done)
                if done < window_end - _EPS:
                    self.loop.at(done, lambda i=i, w=self.window: self._complete(i, w), priority=1)
        used = sum(self.infer) + sum(t[0] for t in self.training.values())
        self.result.peak_gpus = max(self.result.peak_gpus, used)

    def _start_window(self, w: int) -> None:
        self._advance()
        self.window, self.training, self.retrained = w, {}, set()
        for i, s in enumerate(self.sc.streams):
            spec = s.windows[w]
            self.model[i] = spec.start_accuracy if w == 0 else max(spec.start_accuracy, self.model[i] - spec.drift)
        self._apply(self.policy.decide(self._states(w, False), self.sc.gpus, self.sc.window_s, None),
                    self.loop.now + self.sc.window_s)

    def _complete(self, i: int, w: int) -> None:
        if w != self.window or i not in self.training:
            return
        self._advance()
        gpus, acc, _, _ = self.training.pop(i)
        self.model[i] = max(self.model[i], acc)
        self.retrained.add(i)
        self.result.retrainings += 1
        window_end = (w + 1) * self.sc.window_s
        self.infer[i] += gpus  # static policies stop here; the thief starts its search from this
        if not self.policy.reinvoke:
            return
        free = self.sc.gpus - sum(t[0] for t in self.training.values())
        start = {infer_job(s.name): self.infer[k] for k, s in enumerate(self.sc.streams)}
        self._apply(self.policy.decide(self._states(w, True), max(0.0, free), window_end - self.loop.now, start),
                    window_end)

    def run(self) -> PolicyResult:
        for w in range(self.sc.n_windows):
            self.loop.at(w * self.sc.window_s, lambda w=w: self._start_window(w), priority=0)
        self.loop.run(until=self.sc.n_windows * self.sc.window_s)
        self._advance()
        self.result.accuracy = self.integral / self.sc.window_s
        return self.result


def simulate_policy(scenario: EkyaScenario, policy: str) -> PolicyResult:
    """Run one named policy over every window of ``scenario``."""
    return _Run(scenario, make_policy(policy, scenario)).run()


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
    for name in policies or scenario.policies:
        make_policy(name, scenario)  # fail on a bad name before simulating anything
    return simulate(scenario, policies)
