"""An emulated bottleneck link between serving nodes: cross-node hand-offs wait in one FIFO queue.

Local workers share one process's memory, so a query stage handing its output to a stage on another node
costs nothing here — unlike a cluster, where every such hand-off crosses the network. Nona (§III-B) models the
network as one bottleneck link of capacity μ bytes/s served first come first served (an M/G/1 queue): a
transfer of ``b`` bytes occupies it for ``b/μ`` and waits behind every transfer queued before it. This link
emulates exactly that on one machine, so routing that spreads a query over nodes pays for it and congestion is
measurable: a hand-off that enters at ``t`` is delivered at ``max(t, link free) + b/μ`` by the link's own
thread. It is emulation — no bytes move; the delay is what a link of capacity μ would add.

Example: μ = 1 MB/s, two 1 kB hand-offs entering together at t = 0 → delivered at 1 ms and 2 ms.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable

from gpu.errors import ConfigError


class EmulatedLink:
    """One FIFO link of ``mu`` bytes/s shared by every cross-node hand-off (Nona §III-B's bottleneck link).

    ``send(now_ns, nbytes, deliver, data)`` books the transfer and calls ``deliver(data)`` on the link's thread
    when it has crossed. ``busy_ns`` / ``wait_ns`` / ``transfers`` / ``bytes`` are the link's counters:
    ``utilisation(elapsed_ns)`` is its ρ over a run, ``wait_ns / transfers`` its mean queueing delay.
    """

    def __init__(self, mu: float):
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 < mu < float("inf"):
            raise ConfigError("link.mu", mu, "must be a finite capacity > 0 (bytes/s)")
        self.mu = float(mu)
        self.transfers = 0
        self.bytes = 0.0
        self.busy_ns = 0
        self.wait_ns = 0
        self._free_ns = 0
        self._due: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stop = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> "EmulatedLink":
        self._thread = threading.Thread(target=self._run, name="emulated-link", daemon=True)
        self._thread.start()
        return self

    def send(self, now_ns: int, nbytes: float, deliver: Callable[[bytes], None], data: bytes = b"") -> int:
        """Queue a transfer of ``nbytes`` entering at ``now_ns`` (``perf_counter_ns``); returns when it will
        be delivered (``deliver(data)``: the bytes stay where they are)."""
        service = round(nbytes / self.mu * 1e9)
        if self._closed:  # a batch drained after the link stopped: hand over at once
            deliver(data)
            return now_ns
        with self._cv:
            start = max(now_ns, self._free_ns)
            done = start + service
            self._free_ns = done
            self.transfers += 1
            self.bytes += nbytes
            self.busy_ns += service
            self.wait_ns += start - now_ns
            heapq.heappush(self._due, (done, next(self._seq), lambda: deliver(data)))
            self._cv.notify()
        return done

    def utilisation(self, elapsed_ns: int) -> float:
        """The link's ρ over ``elapsed_ns``: the share of it spent transferring."""
        return self.busy_ns / elapsed_ns if elapsed_ns > 0 else 0.0

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    now = time.perf_counter_ns()
                    if self._due and self._due[0][0] <= now:
                        break
                    if self._stop and not self._due:
                        return
                    self._cv.wait((self._due[0][0] - now) / 1e9 if self._due else None)
                due = []
                while self._due and self._due[0][0] <= now:
                    due.append(heapq.heappop(self._due)[2])
            for deliver in due:  # outside the lock: a delivery may run a batch that hands off again
                try:
                    deliver()
                except BaseException as exc:  # keep the link running; the runtime reports the first error
                    self.error = self.error or exc

    def close(self) -> None:
        """Deliver what is in flight (at its time), then stop the link's thread."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
        self._closed = True
        if self.error is not None:
            raise self.error
