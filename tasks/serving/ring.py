"""A session's request queue as columns: preallocated numpy arrays written by the frontend, sliced by the worker.

The structure-of-arrays hot path of the serving runtime (target: dispatch overhead ≤ 5 % of a small
model's batch-1 latency): no Python object per request. The frontend's thread appends a burst of k
requests as k rows — deadline, arrival (int64 ns on ``perf_counter_ns``), request id, app code and the input
row in one float32 ``capacity×d`` block — and the worker's thread decides over the deadline column
(``gpu.batching.SpanPolicy``) and runs a batch as one slice of rows: the inputs are a view, not a copy
(``torch.from_numpy`` of a numpy slice: half the cost of slicing a tensor, which also tracks the view).

Concurrency (one producer thread, one consumer thread): rows ``[head, tail)`` are queued. The producer
only writes at ``tail`` and, when full, grows into new arrays that keep every row's index (the consumer's
in-flight batch view keeps the old arrays alive); the consumer only advances ``head``. The one operation
that moves rows — compaction to index 0 once ``head`` passes half the capacity, and the reordering an
object policy's out-of-order pick needs — runs on the consumer's thread between batches (no view is in
flight), under the ring's lock, which the producer takes for each push.
"""

from __future__ import annotations

import threading
from typing import Iterator, Mapping

import numpy as np
import torch

from gpu.errors import ConfigError

_COLUMNS = ("deadline", "arrival", "request_id", "app")


class RequestRing:
    """Queued requests of one session: columns ``deadline``/``arrival`` (int64 ns), ``request_id``, ``app``
    and the inputs ``x`` (float32 rows)."""

    __slots__ = ("lock", "head", "tail", "capacity", "deadline", "arrival", "request_id", "app", "x",
                 "row_views", "columns", "width", "_initial")

    def __init__(self, capacity: int = 4096, width: int | None = None):
        """``width``: values per input row (the served model's input); None takes the first push's."""
        self.lock = threading.Lock()
        self.head = self.tail = 0
        self.capacity = 0  # the arrays are allocated at the first push, when the input width is known
        self.deadline = self.arrival = self.request_id = np.zeros(0, np.int64)
        self.app = np.zeros(0, np.int32)
        self.x = np.zeros((0, 0), np.float32)
        self.row_views: list[torch.Tensor | None] = []  # 1×d tensor views of ``x``, made once per row index
        self.columns = RingColumns(self)
        self.width = width
        self._initial = capacity

    def __len__(self) -> int:
        return self.tail - self.head

    def push(self, ids: np.ndarray | int, arrival_ns: np.ndarray | int, deadline_ns: np.ndarray | int, xs: np.ndarray,
             app: int = 0) -> None:
        """Append ``len(xs)`` requests (producer thread); ``ids`` an array or the first id, the stamps one int for
        all or an array with one per request."""
        k = len(xs)
        lock = self.lock
        lock.acquire()  # acquire/release: half the cost of ``with``
        try:
            t = self.tail
            e = t + k
            if xs.shape[1] != self.width:
                if self.width is not None:
                    check_width(xs, self.width)
                self.width = xs.shape[1]
            if e > self.capacity:
                self._grow(k, xs.shape[1])
            if k == 1 and type(arrival_ns) is int and type(ids) is int:  # scalar stores: 1/3 of a slice write
                self.deadline[t] = deadline_ns
                self.arrival[t] = arrival_ns
                self.request_id[t] = ids
                self.app[t] = app
                self.x[t] = xs
            else:
                self.deadline[t:e] = deadline_ns
                self.arrival[t:e] = arrival_ns
                self.request_id[t:e] = np.arange(ids, ids + k) if isinstance(ids, int) else ids
                self.app[t:e] = app
                self.x[t:e] = xs
            self.tail = e
        finally:
            lock.release()

    def _grow(self, k: int, dim: int) -> None:
        """New arrays with room for ``k`` more rows, every row at its index (under the lock)."""
        t = self.tail
        cap = max(self.capacity, self._initial)
        while t + k > cap:
            cap *= 2
        for name in _COLUMNS:
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[:t] = old[:t]
            setattr(self, name, new)
        x = np.zeros((cap, dim), np.float32)
        if t:
            x[:t] = self.x[:t]
        self.x, self.capacity = x, cap
        self.row_views = [None] * cap

    def inputs(self, s: int, e: int) -> torch.Tensor:
        """Rows ``[s, e)`` of the inputs as a tensor view (a batch of one reuses its row's cached view: a torch
        slice costs µs, as much as the rest of a request's path)."""
        if e - s > 1:
            return torch.from_numpy(self.x[s:e])
        x = self.row_views[s]
        if x is None:
            x = self.row_views[s] = torch.from_numpy(self.x[s:e])
        return x

    def compact(self) -> None:
        """Move the queued rows to index 0 (consumer thread, between batches)."""
        with self.lock:
            h, t = self.head, self.tail
            n = t - h
            if h and n:
                for name in _COLUMNS:
                    col = getattr(self, name)
                    col[:n] = col[h:t]  # numpy copies overlapping ranges correctly
                self.x[:n] = self.x[h:t]
            self.head, self.tail = 0, n

    def rows(self, s: int, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of (request ids, arrivals, deadlines) of rows ``[s, e)``, to outlive a compaction; a batch of
        one as three ints."""
        if e - s == 1:
            return self.request_id.item(s), self.arrival.item(s), self.deadline.item(s)  # type: ignore[return-value]
        return self.request_id[s:e].copy(), self.arrival[s:e].copy(), self.deadline[s:e].copy()

    def take(self, positions: np.ndarray) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]:
        """Remove arbitrary queued rows (offsets from ``head``; an object policy's out-of-order pick) and return
        their inputs and (ids, arrivals, deadlines); the rest keep their order (consumer thread)."""
        with self.lock:
            h, t = self.head, self.tail
            idx = h + positions
            out = (torch.from_numpy(self.x[idx]), self.request_id[idx], self.arrival[idx], self.deadline[idx])
            keep = np.ones(t - h, bool)
            keep[positions] = False
            rest = h + np.flatnonzero(keep)
            start = t - len(rest)
            for name in (*_COLUMNS, "x"):
                col = getattr(self, name)
                col[start:t] = col[rest]  # the fancy index copies first
            self.head = start
        return out


class RingColumns(Mapping):
    """The per-request columns of the queued rows, as read-only views, for ``SpanPolicy.decide_span``."""

    __slots__ = ("_ring", "h", "t")

    def __init__(self, ring: RequestRing):
        self._ring, self.h, self.t = ring, 0, 0

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in _COLUMNS:
            raise KeyError(key)
        view = getattr(self._ring, key)[self.h:self.t]
        view.flags.writeable = False
        return view

    def __iter__(self) -> Iterator[str]:
        return iter(_COLUMNS)

    def __len__(self) -> int:
        return len(_COLUMNS)


def check_width(xs: np.ndarray, width: int) -> None:
    """Refuse ``k×d`` inputs whose ``d`` is not the served models' ``width``, naming them (a remote worker's
    handle checks before sending: an error raised in the actor would reach nobody)."""
    if xs.shape[1] != width:
        raise ConfigError("inputs", f"{len(xs)} rows of {xs.shape[1]} values",
                          f"this session's requests have {width} values each")


def as_rows(xs: object) -> np.ndarray:
    """Inputs as a float32 ``k×d`` array: a ``k×d`` or ``d`` array/CPU tensor, or a sequence of rows."""
    a = xs
    if type(a) is not np.ndarray:  # the fast path: what the load generator sends
        a = xs.numpy() if isinstance(xs, torch.Tensor) else xs
    if not isinstance(a, np.ndarray):
        a = np.stack([np.asarray(x, np.float32).reshape(-1) for x in a])  # type: ignore[union-attr]
    return a.reshape(1, -1) if a.ndim == 1 else a

