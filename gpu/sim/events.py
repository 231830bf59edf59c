"""The simulation clock: a heap of timed events with a tie-break counter (SimPy's shape).

Simultaneous events run in insertion order, so a seeded simulation is reproducible.
Simulators own an ``EventLoop`` and call the same scheduler functions the runners call.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(order=True)
class _Entry:
    time: float
    priority: int
    seq: int
    callback: Callable[[], Any] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class EventHandle:
    """Lets a simulator cancel an event it scheduled (e.g. a completion that a re-allocation moved)."""

    def __init__(self, entry: _Entry):
        self._entry = entry

    @property
    def time(self) -> float:
        return self._entry.time

    def cancel(self) -> None:
        self._entry.cancelled = True


class EventLoop:
    """Virtual time that advances from event to event."""

    def __init__(self, start: float = 0.0):
        self.now = float(start)
        self._queue: list[_Entry] = []
        self._seq = itertools.count()

    def at(self, time: float, callback: Callable[[], Any], priority: int = 0) -> EventHandle:
        """Schedule ``callback`` at absolute ``time``; lower ``priority`` runs first among equal times."""
        if time < self.now or math.isnan(time):
            raise ValueError(f"time={time!r}: cannot schedule before now={self.now!r}")
        entry = _Entry(float(time), priority, next(self._seq), callback)
        heapq.heappush(self._queue, entry)
        return EventHandle(entry)

    def after(self, delay: float, callback: Callable[[], Any], priority: int = 0) -> EventHandle:
        """Schedule ``callback`` ``delay`` time units from now."""
        if delay < 0:
            raise ValueError(f"delay={delay!r}: must be >= 0")
        return self.at(self.now + delay, callback, priority)

    def peek(self) -> float:
        """Time of the next live event, or infinity when none is left."""
        while self._queue and self._queue[0].cancelled:
            heapq.heappop(self._queue)
        return self._queue[0].time if self._queue else math.inf

    def step(self) -> bool:
        """Run the next event; return False when the schedule is empty."""
        if self.peek() == math.inf:
            return False
        entry = heapq.heappop(self._queue)
        self.now = entry.time
        entry.callback()
        return True

    def run(self, until: float | None = None) -> float:
        """Run events up to and including time ``until`` (or until none is left); return the clock."""
        while True:
            nxt = self.peek()
            if nxt == math.inf or (until is not None and nxt > until):
                break
            self.step()
        if until is not None and until > self.now:
            self.now = float(until)
        return self.now
