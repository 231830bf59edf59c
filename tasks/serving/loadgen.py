"""Open-loop load for the serving runtime: Poisson arrivals at rates that follow a trace of phases.

A :class:`RateTrace` is piecewise constant: phase ``k`` sets every session's rate from ``start_s`` until
the next phase. Arrivals within a phase are a Poisson process (``gpu.sim.nexus.engine.arrival_times``,
the same generator the simulator uses), so a real run and a simulated run of the same trace and seed
see the same arrival times. Every turn, the generator hands over each arrival that is due — those of one
session in one ``submit_many`` call, as a server's event loop reads every request that arrived during its
last turn — stamped with its *scheduled* arrival time: when the frontend's thread was busy (it runs
batches for idle workers), the requests that came due meanwhile wait, and that wait is part of their
latency (no coordinated omission). It calls ``on_beacon(t_s)`` every beacon, where a flow reads the
frontend's per-session counts and lets the epoch planner re-plan. A session several applications share
(``apps``) sends each arrival as one of them, drawn by their shares, with that application's inputs.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from gpu.errors import ConfigError
from gpu.sim.nexus.engine import arrival_times
from tasks.serving.interrupt import StopRequest


@dataclass(frozen=True)
class RatePhase:
    """From ``start_s`` on, session id → requests/s."""

    start_s: float
    rates: Mapping[str, float]

    def __post_init__(self) -> None:
        if not (isinstance(self.start_s, (int, float)) and self.start_s >= 0):
            raise ConfigError("trace.start_s", self.start_s, "must be a number >= 0 (seconds)")
        for sid, r in self.rates.items():
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not np.isfinite(r) or r < 0:
                raise ConfigError(f"trace.rates.{sid}", r, "must be a finite number >= 0 (requests/s)")


@dataclass(frozen=True)
class RateTrace:
    """Phases in time order over ``[0, duration_s)``; the first starts at 0."""

    phases: tuple[RatePhase, ...]
    duration_s: float

    def __post_init__(self) -> None:
        if not self.phases or self.phases[0].start_s != 0:
            raise ConfigError("trace.phases", [p.start_s for p in self.phases], "the first phase must start at 0 s")
        starts = [p.start_s for p in self.phases]
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise ConfigError("trace.phases", starts, "phase starts must be strictly increasing")
        if not self.duration_s > 0:
            raise ConfigError("trace.duration_s", self.duration_s, "must be > 0 seconds")

    @classmethod
    def constant(cls, rates: Mapping[str, float], duration_s: float) -> "RateTrace":
        return cls((RatePhase(0.0, dict(rates)),), duration_s)

    def rates_at(self, t_s: float) -> dict[str, float]:
        current = self.phases[0]
        for p in self.phases:
            if p.start_s <= t_s:
                current = p
        return dict(current.rates)

    def arrivals(self, seed: int = 0) -> tuple[np.ndarray, list[str]]:
        """All arrivals of the trace: times (s, sorted) and the session of each."""
        rng = np.random.default_rng(seed)
        times: list[np.ndarray] = []
        who: list[np.ndarray] = []
        sids = sorted({s for p in self.phases for s in p.rates})
        for k, p in enumerate(self.phases):
            end = self.phases[k + 1].start_s if k + 1 < len(self.phases) else self.duration_s
            end = min(end, self.duration_s)
            if end <= p.start_s:
                continue
            for j, sid in enumerate(sids):
                t = arrival_times(p.rates.get(sid, 0.0), end - p.start_s, "poisson", rng) / 1000.0 + p.start_s
                times.append(t)
                who.append(np.full(len(t), j))
        t_all = np.concatenate(times) if times else np.empty(0)
        w_all = np.concatenate(who) if who else np.empty(0, dtype=int)
        order = np.argsort(t_all, kind="stable")
        return t_all[order], [sids[int(j)] for j in w_all[order]]


@dataclass
class LoadReport:
    """What the generator did: requests sent, the true label of each request id, and how late it ran.

    ``start_ms``: time 0 of the trace on ``perf_counter`` (arrival k is stamped ``start + times[k]``);
    ``max_lag_ms``: the most an arrival waited to be handed over; ``calls``: calls to the frontend;
    ``interrupted``: the run stopped before the trace's end (``stop``)."""

    start_ms: float
    sent: int = 0
    labels: dict[int, int] = field(default_factory=dict)
    max_lag_ms: float = 0.0
    calls: int = 0
    interrupted: bool = False


class LoadGenerator:
    """Submits a trace's arrivals to a frontend in real time, cycling through input images.

    Args:
        submit: ``frontend.submit(session_id, x, arrival_ns) -> request id``.
        submit_many: ``frontend.submit_many(session_id, xs, arrival_ns) -> request ids``: when given,
            arrivals of a session that are due together (the frontend was busy, or they share a sleep) go
            over in one call, their inputs as one ``k×64`` array and their scheduled times as an array.
        trace: the rates over time.
        inputs: N×64 input images; request k carries row ``k mod N`` (a 1×64 float32 array).
        labels: their true classes (to measure the served models' accuracy).
        tick_s: the shortest time between two turns (0: wake for each next arrival). A frontend's event loop
            reads whatever arrived during its last turn; a tick of 0.1–1 ms models one that polls, so bursts
            of ``rate × tick`` amortise its per-call cost (the wait for the tick is in their latency).
        turn: a context manager factory wrapped around each turn's submissions (``frontend.turn``: a
            turn's bursts to one Ray actor go as one call).
        apps: session → its applications as ``(app id, share, inputs)``, ``inputs`` that application's rows
            (aligned with ``inputs``: the same images, e.g. corrupted); arrivals go to them by share.
    """

    def __init__(self, submit: Callable[[str, np.ndarray, int], int], trace: RateTrace, inputs: torch.Tensor,
                 labels: torch.Tensor | Sequence[int] | None = None, seed: int = 0,
                 submit_many: Callable[[str, np.ndarray, np.ndarray], Sequence[int]] | None = None,
                 tick_s: float = 0.0, turn: Callable[[], AbstractContextManager] | None = None,
                 apps: Mapping[str, Sequence[tuple[str, float, np.ndarray]]] | None = None):
        if not tick_s >= 0:
            raise ConfigError("tick_s", tick_s, "must be >= 0 seconds")
        self.apps = {sid: [(name, share, np.ascontiguousarray(xs, np.float32)) for name, share, xs in a]
                     for sid, a in (apps or {}).items() if a}
        self.submit = submit
        self.submit_many = submit_many
        self.trace = trace
        self.inputs = np.ascontiguousarray(inputs.numpy(), np.float32)
        self.rows = [self.inputs[k:k + 1] for k in range(len(self.inputs))]  # 1×d: one request, as a client sends
        self.labels = [int(y) for y in labels] if labels is not None else None
        self.seed = seed
        self.tick_s = float(tick_s)
        self.turn = turn or nullcontext

    def run(self, on_beacon: Callable[[float], None] | None = None, beacon_s: float = 1.0,
            stop: StopRequest | None = None) -> LoadReport:
        """Send every arrival at its time; call ``on_beacon(t_s)`` at each beacon (blocking the generator). Ends
        early, at its next turn, once ``stop.requested`` (``tasks.serving.interrupt``: Ctrl-C)."""
        times, who = self.trace.arrivals(self.seed)
        sids = sorted(set(who))
        code = {sid: j for j, sid in enumerate(sids)}
        codes = np.fromiter((code[w] for w in who), np.int64, len(who))
        pick = self._pick_apps(codes, sids)
        t0 = time.perf_counter_ns()
        stamps = t0 + np.round(times * 1e9).astype(np.int64)  # scheduled arrivals on perf_counter_ns
        report = LoadReport(start_ms=t0 / 1e6)
        n, rows, labels, inputs = len(times), self.rows, self.labels, self.inputs
        m_rows = len(rows)
        end_s = self.trace.duration_s + 1e-9
        next_beacon = beacon_s
        next_turn = 0.0
        i = 0
        while True:
            if stop is not None and stop.requested:
                report.interrupted = True
                break
            now = (time.perf_counter_ns() - t0) / 1e9
            while on_beacon is not None and now >= next_beacon and next_beacon <= end_s:
                on_beacon(next_beacon)
                next_beacon += beacon_s
                now = (time.perf_counter_ns() - t0) / 1e9
            if i >= n and (on_beacon is None or next_beacon > end_s):
                break
            due = max(times[i], next_turn) if i < n else self.trace.duration_s
            if due > now:
                time.sleep(min(due, next_beacon) - now if on_beacon else due - now)
                continue
            report.max_lag_ms = max(report.max_lag_ms, float(now - times[i]) * 1000.0)
            next_turn = now + self.tick_s
            j = int(times.searchsorted(now, side="right"))
            with self.turn():
                if j - i == 1 or self.submit_many is None:
                    for m in range(i, j):
                        k = m % m_rows
                        if pick[m] < 0:
                            rid = self.submit(who[m], rows[k], int(stamps[m]))
                        else:
                            name, _, xs = self.apps[who[m]][pick[m]]
                            rid = self.submit(who[m], xs[k:k + 1], int(stamps[m]), app=name)
                        report.calls += 1
                        if labels is not None:
                            report.labels[rid] = labels[k]
                else:  # everything due goes over now, one call per session (and application), as a server reads
                    span = np.arange(i, j)
                    burst = codes[i:j]
                    for c in np.unique(burst).tolist():
                        idx = span if len(sids) == 1 else span[burst == c]
                        for name, xs, part in self._by_app(sids[c], idx, pick, inputs):
                            ks = part % m_rows
                            ids = self.submit_many(sids[c], xs[ks], stamps[part], **({"app": name} if name else {}))
                            report.calls += 1
                            if labels is not None:
                                report.labels.update(zip(ids, [labels[k] for k in ks.tolist()]))
            i = j
        report.sent = i
        return report

    def _pick_apps(self, codes: np.ndarray, sids: list[str]) -> np.ndarray:
        """Per arrival, the index of its application in its session's ``apps`` (-1: the session has none)."""
        pick = np.full(len(codes), -1, np.int64)
        rng = np.random.default_rng([self.seed, 1])
        for c, sid in enumerate(sids):
            if sid in self.apps:
                mask = codes == c
                shares = np.array([share for _, share, _ in self.apps[sid]])
                pick[mask] = rng.choice(len(shares), size=int(mask.sum()), p=shares / shares.sum())
        return pick

    def _by_app(self, sid: str, idx: np.ndarray, pick: np.ndarray,
                inputs: np.ndarray) -> list[tuple[str | None, np.ndarray, np.ndarray]]:
        """A session's due arrivals ``idx`` as ``(application, its inputs, its arrivals)`` groups."""
        if sid not in self.apps:
            return [(None, inputs, idx)]
        return [(name, xs, idx[pick[idx] == a]) for a, (name, _, xs) in enumerate(self.apps[sid])
                if (pick[idx] == a).any()]
