"""The bottleneck link between serving nodes as real transfers: bytes over a loopback TCP socket, paced at μ.

Nona (§III-B) models the network as one bottleneck link of capacity μ bytes/s serving transfers first come
first served. ``SocketLink`` is that link made of real parts: every cross-node hand-off is framed (a header, the
child requests' input rows, and zero bytes up to the hand-off's activation size) and written by the link's
sender thread into one TCP connection over the loopback interface; the receiver thread reads it off the socket,
rebuilds the rows from the bytes it received and hands them to the child's worker. Transfers leave in arrival
order (one sender, one connection: a FIFO queue). Where the modelled link is slower than loopback, a token bucket
on the sender (``TokenBucket``, rate μ, no burst beyond what the rate has earned) holds each chunk until the link
would have serialised it, so a transfer of ``b`` bytes takes at least ``b/μ`` plus what the kernel, the copies
and the threads really add.

The link measures itself: ``wait_ns`` (queueing before the sender took a transfer), ``busy_ns`` (first byte
written to last byte read, per transfer) and ``bytes``; ``take_measured`` returns the bytes and busy time since
its last call, so a world can feed Nona the link's *measured* μ (``measured_mu``) instead of the configured one.
``probe_mu`` measures a fresh link before anything is solved.

``tasks.serving.link.EmulatedLink`` (``--link emulated``) is the same FIFO link as arithmetic, with no bytes.

Example: μ = 1 MB/s, three 1 kB hand-offs sent together → received about 1, 2 and 3 ms later.
"""

from __future__ import annotations

import itertools
import socket
import statistics
import struct
import threading
import time
from collections import deque
from typing import Callable

from gpu.errors import ConfigError

HEADER = struct.Struct("!QQQ")  # transfer id, bytes on the wire after the header, bytes of data among them
CHUNK = 16 * 1024  # bytes written per send call (the token bucket's unit)


class TokenBucket:
    """Tokens (bytes) accrue at ``rate`` per second up to ``depth``; ``take(n)`` blocks until n are there.

    ``depth`` 0 (the default) is a strict shaper: ``n`` bytes leave no sooner than ``n/rate`` after the previous
    ones, as on a link of that capacity; a deeper bucket lets an idle link send that many bytes at once."""

    def __init__(self, rate: float, depth: float = 0.0):
        self.rate, self.depth = float(rate), float(depth)
        self._tokens, self._last = self.depth, time.perf_counter()

    def take(self, n: int) -> None:
        now = time.perf_counter()
        self._tokens = min(self.depth, self._tokens + (now - self._last) * self.rate) - n
        self._last = now
        if self._tokens < 0:  # pay off the debt: the bytes leave when the link would have carried them
            time.sleep(-self._tokens / self.rate)


class SocketLink:
    """One FIFO link of ``mu`` bytes/s made of a loopback TCP connection and two threads (Nona §III-B).

    ``send(now_ns, nbytes, deliver, data)`` queues a transfer of ``max(nbytes, len(data))`` bytes entering at
    ``now_ns`` (``perf_counter_ns``); once its last byte has been read off the socket, ``deliver(received)`` runs
    on the receiver thread with the ``data`` bytes as they came through. ``mu=None`` sends at loopback speed.
    Counters as ``EmulatedLink``'s: ``transfers``, ``bytes``, ``busy_ns``, ``wait_ns``, ``utilisation``.
    """

    def __init__(self, mu: float | None, chunk: int = CHUNK):
        if mu is not None and (isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 < mu < float("inf")):
            raise ConfigError("link.mu", mu, "must be a finite capacity > 0 (bytes/s)")
        self.mu = None if mu is None else float(mu)
        self.chunk = int(chunk)
        self.transfers = 0
        self.bytes = 0.0
        self.busy_ns = 0
        self.wait_ns = 0
        self._measured = [0.0, 0]  # bytes and busy ns since ``take_measured``
        self._queue: deque[tuple[int, int, int, bytes]] = deque()
        self._pending: dict[int, tuple[Callable[[bytes], None], int, int]] = {}
        self._ids = itertools.count()
        self._cv = threading.Condition()
        self._inflight = 0
        self._stop = False
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._tx: socket.socket | None = None
        self._rx: socket.socket | None = None
        self.error: BaseException | None = None

    def start(self) -> "SocketLink":
        server = socket.create_server(("127.0.0.1", 0))
        try:
            self._tx = socket.create_connection(server.getsockname())
            self._rx, _ = server.accept()
        finally:
            server.close()
        self._tx.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._threads = [threading.Thread(target=self._send_loop, name="socket-link-send", daemon=True),
                         threading.Thread(target=self._receive_loop, name="socket-link-receive", daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def send(self, now_ns: int, nbytes: float, deliver: Callable[[bytes], None], data: bytes = b"") -> None:
        """Queue a transfer of ``nbytes`` (at least ``data``'s length) that entered at ``now_ns``."""
        if self._closed:  # a batch drained after the link stopped: hand over at once
            deliver(data)
            return
        with self._cv:
            tid = next(self._ids)
            size = max(int(round(nbytes)), len(data))
            self._pending[tid] = (deliver, size, 0)
            self._queue.append((tid, now_ns, size, data))
            self._inflight += 1
            self._cv.notify_all()

    def _send_loop(self) -> None:
        bucket = TokenBucket(self.mu) if self.mu is not None else None
        assert self._tx is not None
        try:
            while True:
                with self._cv:
                    while not self._queue and not self._stop:
                        self._cv.wait()
                    if not self._queue:
                        return
                    tid, entered, size, data = self._queue.popleft()
                    start = time.perf_counter_ns()
                    deliver, _, _ = self._pending[tid]
                    self._pending[tid] = (deliver, size, start)
                    self.wait_ns += max(0, start - entered)
                frame = memoryview(HEADER.pack(tid, size, len(data)) + data + bytes(size - len(data)))
                for at in range(0, len(frame), self.chunk):
                    piece = frame[at:at + self.chunk]
                    if bucket is not None:
                        bucket.take(len(piece))
                    self._tx.sendall(piece)
        except BaseException as exc:  # the runtime reports the first error at close
            self.error = self.error or exc
            with self._cv:
                self._stop = True
                self._cv.notify_all()

    def _receive_loop(self) -> None:
        assert self._rx is not None
        try:
            while True:
                head = self._read(HEADER.size)
                if head is None:
                    return
                tid, size, used = HEADER.unpack(head)
                body = self._read(size)
                if body is None:
                    return
                done = time.perf_counter_ns()
                with self._cv:
                    deliver, _, start = self._pending.pop(tid)
                    self.transfers += 1
                    self.bytes += size
                    self.busy_ns += done - start
                    self._measured[0] += size
                    self._measured[1] += done - start
                try:
                    deliver(bytes(body[:used]))
                except BaseException as exc:  # keep the link running; the runtime reports the first error
                    self.error = self.error or exc
                with self._cv:
                    self._inflight -= 1
                    self._cv.notify_all()
        except BaseException as exc:
            self.error = self.error or exc

    def _read(self, n: int) -> bytearray | None:
        """Exactly ``n`` bytes from the socket (None: the sender closed it)."""
        assert self._rx is not None
        out = bytearray(n)
        view, got = memoryview(out), 0
        while got < n:
            k = self._rx.recv_into(view[got:], n - got)
            if k == 0:
                return None
            got += k
        return out

    def utilisation(self, elapsed_ns: int) -> float:
        """The link's ρ over ``elapsed_ns``: the share of it spent transferring."""
        return self.busy_ns / elapsed_ns if elapsed_ns > 0 else 0.0

    def take_measured(self) -> tuple[float, int]:
        """Bytes moved and ns spent moving them since the last call (what an epoch measures of the link)."""
        with self._cv:
            out = (self._measured[0], self._measured[1])
            self._measured = [0.0, 0]
        return out

    def close(self) -> None:
        """Deliver what is queued and in flight, then close the socket and stop the threads."""
        with self._cv:
            while self._inflight and self.error is None:
                self._cv.wait(0.1)
            self._stop = True
            self._cv.notify_all()
        self._closed = True
        if self._threads:
            self._threads[0].join()
            if self._tx is not None:
                self._tx.shutdown(socket.SHUT_WR)  # the receiver reads the end of the stream and stops
            self._threads[1].join()
        for s in (self._tx, self._rx):
            if s is not None:
                s.close()
        if self.error is not None:
            raise self.error


def measured_mu(nbytes: float, busy_ns: int) -> float | None:
    """μ (bytes/s) a link showed: bytes over the time spent moving them (None: nothing moved)."""
    return nbytes / busy_ns * 1e9 if busy_ns > 0 and nbytes > 0 else None


def probe_mu(mu: float | None, nbytes: float, count: int = 20) -> float:
    """Measure a fresh ``SocketLink``: ``count`` transfers of ``nbytes``, one at a time; μ = bytes over the median
    transfer time (first byte written to last byte read). What Nona is solved with before the rollout."""
    link = SocketLink(mu).start()
    times: list[int] = []
    got = threading.Event()
    try:
        for _ in range(count):
            got.clear()
            link.send(time.perf_counter_ns(), nbytes, lambda data: got.set())
            got.wait()
            moved, busy = link.take_measured()
            times.append(busy)
    finally:
        link.close()
    return float(nbytes) / statistics.median(times) * 1e9
