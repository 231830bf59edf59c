"""Doorbells between the processes of one pool: a grant rings the waiting owner's bell.

Waiters sleep on a Unix datagram socket in the abstract namespace (no file to clean up, gone
with the process) instead of polling the ledger: a commit wakes only the processes it granted
something to, so the cost of waiting does not grow with the number of waiting processes. A
lost ring is harmless: waiters also look at the ledger every ``SAFETY_POLL_S``.
"""

from __future__ import annotations

import hashlib
import socket
from typing import Iterable

SAFETY_POLL_S = 0.5


class Doorbells:
    """Bells of one pool (``pool_id``), addressed by ledger owner key."""

    def __init__(self, pool_id: str):
        self.pool_id = pool_id
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)

    def address(self, owner_key: str) -> str:
        return "\0gpuflows-" + hashlib.sha1(f"{self.pool_id}/{owner_key}".encode()).hexdigest()[:32]

    def listen(self, owner_key: str) -> socket.socket:
        """The socket ``owner_key``'s watcher sleeps on."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(self.address(owner_key))
        return sock

    def ring(self, owner_keys: Iterable[str]) -> None:
        for key in owner_keys:
            try:
                self._out.sendto(b"!", self.address(key))
            except OSError:  # nobody listening (another host, or gone), or its queue is full
                pass

    def close(self) -> None:
        self._out.close()


def drain(sock: socket.socket, timeout: float) -> bool:
    """Wait up to ``timeout`` for a ring; True if at least one came (all queued ones are consumed)."""
    sock.settimeout(timeout)
    try:
        sock.recv(16)
    except (socket.timeout, BlockingIOError):
        return False
    sock.setblocking(False)
    try:
        while True:
            sock.recv(16)
    except BlockingIOError:
        pass
    return True
