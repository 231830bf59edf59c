"""What happened to every request the runtime received, and the per-window figures a flow logs.

Workers and the frontend append one chunk of arrays per executed batch or dropped group (``list.append`` is atomic
in CPython, so no lock sits on the request path); a flow turns a time window of them into throughput, SLO
attainment and bad rate (Nexus §7: a request is *bad* if it is dropped or misses its deadline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import numpy as np

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
    """Append-only log of request outcomes, one chunk of arrays per executed batch or dropped group.

    A chunk is ``(session, node, ids, arrival_ns, deadline_ns, finish_ns, batch, preds)`` — the columns of
    a slice of a worker's ring (finish ``None`` when dropped; a batch of one's ids and times as ints): no
    per-request object on the serving path.
    :attr:`outcomes` and :meth:`take` expand chunks into :class:`Outcome` rows when a flow reads them;
    :meth:`window` works on the columns. ``list.append`` and ``del lst[:n]`` are atomic in CPython, so
    writers on several threads need no lock.
    """

    def __init__(self) -> None:
        self._chunks: list[tuple[str, int, np.ndarray, np.ndarray, np.ndarray, int | None, int,
                                 np.ndarray | None]] = []

    def served(self, session_id: str, node_id: int, ids: np.ndarray | int, arrival_ns: np.ndarray | int,
               deadline_ns: np.ndarray | int, finish_ns: int, preds: np.ndarray | list[int]) -> None:
        self._chunks.append((session_id, node_id, ids, arrival_ns, deadline_ns, finish_ns, len(preds), preds))

    def dropped(self, session_id: str, node_id: int, ids: np.ndarray, arrival_ns: np.ndarray,
                deadline_ns: np.ndarray) -> None:
        self._chunks.append((session_id, node_id, ids, arrival_ns, deadline_ns, None, 0, None))

    @staticmethod
    def _expand(chunks) -> list[Outcome]:
        out: list[Outcome] = []
        for sid, node, ids, arr, dl, finish, batch, preds in chunks:
            f = _NAN if finish is None else finish / 1e6
            cols = (np.atleast_1d(c).tolist() for c in (ids, arr, dl))
            out.extend(Outcome(i, sid, node, a / 1e6, d / 1e6, f, batch, p) for i, a, d, p in
                       zip(*cols, repeat(-1) if preds is None else np.asarray(preds).tolist()))
        return out

    @property
    def outcomes(self) -> list[Outcome]:
        """Every outcome so far, in the order batches finished (drops in the order they were decided)."""
        return self._expand(self._chunks[:])

    def take(self) -> list[Outcome]:
        """The outcomes so far, removing them from the log."""
        return self._expand(self.take_chunks())

    def take_chunks(self) -> list[tuple]:
        """The raw chunks so far, removing them from the log (what a remote worker ships back: arrays, no
        per-request objects)."""
        n = len(self._chunks)
        chunks = self._chunks[:n]
        del self._chunks[:n]
        return chunks

    def extend(self, chunks: list[tuple]) -> None:
        """Add chunks another recorder took (a remote worker's, on this recorder's clock)."""
        self._chunks.extend(chunks)

    def window(self, start_ms: float = -math.inf, end_ms: float = math.inf, session_id: str | None = None,
               labels: dict[int, int] | None = None) -> WindowStats:
        """Stats of the requests that arrived in ``[start_ms, end_ms)`` (optionally one session's)."""
        chunks = [c for c in self._chunks[:] if session_id is None or c[0] == session_id]
        if not chunks:
            lo, hi = (v if math.isfinite(v) else 0.0 for v in (start_ms, end_ms))
            return WindowStats(lo, hi, 0, 0, 0, 0, 0.0, 0.0, 0.0, math.nan)
        ids, arr, dl = (np.concatenate([np.atleast_1d(c[k]) for c in chunks]) for k in (2, 3, 4))
        sizes = [np.size(c[2]) for c in chunks]
        finish = np.repeat([-1 if c[5] is None else c[5] for c in chunks], sizes).astype(np.int64)
        batch = np.repeat([c[6] for c in chunks], sizes)
        preds = np.concatenate([np.full(k, -1) if c[7] is None else np.asarray(c[7]) for k, c in zip(sizes, chunks)])
        arrival_ms = arr / 1e6
        rows = (arrival_ms >= start_ms) & (arrival_ms < end_ms)
        served = rows & (finish >= 0)
        good = served & (finish <= dl)
        lat = (finish - arr)[served] / 1e6  # per-request latency, completion − arrival
        correct: list[bool] = []
        if labels:
            known = [(lab, p) for i, p in zip(ids[served].tolist(), preds[served].tolist())
                     if (lab := labels.get(i)) is not None]
            correct = [lab == p for lab, p in known]
        lo = float(arrival_ms[rows].min()) if rows.any() and not math.isfinite(start_ms) else start_ms
        hi = float(arrival_ms[rows].max()) if rows.any() and not math.isfinite(end_ms) else end_ms
        return WindowStats(lo if math.isfinite(lo) else 0.0, hi if math.isfinite(hi) else 0.0, int(rows.sum()),
                           int(good.sum()), int((served & ~good).sum()), int((rows & (finish < 0)).sum()),
                           float(batch[served].mean()) if served.any() else 0.0,
                           float(np.percentile(lat, 50)) if len(lat) else 0.0,
                           float(np.percentile(lat, 99)) if len(lat) else 0.0,
                           float(np.mean(correct)) if correct else math.nan)
