"""What happened to every request the runtime received, and the per-window figures a flow logs.

Workers and the frontend append one chunk per executed batch or dropped group (``list.append`` is atomic
in CPython, so no lock sits on the request path); a flow turns a time window of them into throughput, SLO
attainment and bad rate (Nexus §7: a request is *bad* if it is dropped or misses its deadline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple, Sequence

import numpy as np

from gpu.batching import Request

_NAN = math.nan


class Outcome(NamedTuple):
    """One request: times in ms on ``time.perf_counter``'s clock; ``finish_ms`` is NaN when dropped."""

    request_id: int
    session_id: str
    node_id: int
    arrival_ms: float
    deadline_ms: float
    finish_ms: float
    batch: int
    pred: int


@dataclass(frozen=True)
class WindowStats:
    """Figures over the requests that arrived in ``[start_ms, end_ms)``."""

    start_ms: float
    end_ms: float
    offered: int
    good: int
    late: int
    dropped: int
    mean_batch: float
    p50_latency_ms: float
    p99_latency_ms: float
    accuracy: float

    @property
    def seconds(self) -> float:
        return max(1e-9, (self.end_ms - self.start_ms) / 1000.0)

    @property
    def throughput_rps(self) -> float:
        """Good requests (served within their SLO) per second."""
        return self.good / self.seconds

    @property
    def offered_rps(self) -> float:
        return self.offered / self.seconds

    @property
    def slo_attainment(self) -> float:
        return self.good / self.offered if self.offered else 1.0

    @property
    def bad_rate(self) -> float:
        return (self.late + self.dropped) / self.offered if self.offered else 0.0

    def metrics(self) -> dict[str, float]:
        return {"offered_rps": self.offered_rps, "throughput_rps": self.throughput_rps,
                "slo_attainment": self.slo_attainment, "bad_rate": self.bad_rate, "dropped": float(self.dropped),
                "late": float(self.late), "mean_batch": self.mean_batch, "p50_latency_ms": self.p50_latency_ms,
                "p99_latency_ms": self.p99_latency_ms, "accuracy": self.accuracy}


class Recorder:
    """Append-only log of request outcomes, one chunk per executed batch or dropped group.

    The worker hands a batch back as one tuple (its ``Request`` objects, node, finish time, batch size,
    predictions) — no per-request object on the serving path; :attr:`outcomes` and :meth:`window` expand the
    chunks when a flow reads them. ``list.append`` and ``del lst[:n]`` are atomic in CPython, so writers on
    several threads need no lock.
    """

    def __init__(self) -> None:
        self._chunks: list[tuple[Sequence[Request], int, float, int, Sequence[int] | None]] = []

    def served(self, reqs: Sequence[Request], preds: Sequence[int], node_id: int, finish_ms: float) -> None:
        self._chunks.append((reqs, node_id, finish_ms, len(reqs), preds))

    def dropped(self, reqs: Sequence[Request], node_id: int) -> None:
        self._chunks.append((reqs, node_id, _NAN, 0, None))

    @staticmethod
    def _expand(chunks) -> list[Outcome]:
        out: list[Outcome] = []
        for reqs, node, finish, batch, preds in chunks:
            out.extend(Outcome(r.request_id, r.app_id, node, r.arrival_ms, r.deadline_ms, finish, batch, p)
                       for r, p in zip(reqs, repeat(-1) if preds is None else preds))
        return out

    @property
    def outcomes(self) -> list[Outcome]:
        """Every outcome so far, in the order batches finished (drops in the order they were decided)."""
        return self._expand(self._chunks[:])

    def take(self) -> list[Outcome]:
        """The outcomes so far, removing them from the log (what a remote worker ships back)."""
        n = len(self._chunks)
        chunks = self._chunks[:n]
        del self._chunks[:n]
        return self._expand(chunks)

    def window(self, start_ms: float = -math.inf, end_ms: float = math.inf, session_id: str | None = None,
               labels: dict[int, int] | None = None) -> WindowStats:
        """Stats of the requests that arrived in the window (optionally one session's)."""
        rows = [o for o in self.outcomes
                if start_ms <= o.arrival_ms < end_ms and (session_id is None or o.session_id == session_id)]
        finish = np.array([o.finish_ms for o in rows], dtype=float)
        deadline = np.array([o.deadline_ms for o in rows], dtype=float)
        arrival = np.array([o.arrival_ms for o in rows], dtype=float)
        served = ~np.isnan(finish)
        good = served & (finish <= deadline)
        lat = (finish - arrival)[served]
        batches = np.array([o.batch for o in rows], dtype=float)[served]
        correct = [o.pred == labels[o.request_id] for o in rows
                   if labels and o.request_id in labels and not math.isnan(o.finish_ms)]
        lo = rows[0].arrival_ms if rows and not math.isfinite(start_ms) else start_ms
        hi = max((o.arrival_ms for o in rows), default=lo) if not math.isfinite(end_ms) else end_ms
        return WindowStats(lo if math.isfinite(lo) else 0.0, hi if math.isfinite(hi) else 0.0, len(rows),
                           int(good.sum()), int((served & ~good).sum()), int((~served).sum()),
                           float(batches.mean()) if len(batches) else 0.0,
                           float(np.percentile(lat, 50)) if len(lat) else 0.0,
                           float(np.percentile(lat, 99)) if len(lat) else 0.0,
                           float(np.mean(correct)) if correct else math.nan)
