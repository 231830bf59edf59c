"""Ctrl-C (SIGINT) of a serving rollout: stop at the load generator's next turn, not wherever the signal lands.

Python raises KeyboardInterrupt in the main thread at whatever bytecode it is running. In a rollout that is most
often a batch the frontend's thread runs inline for an idle worker (``ServingWorker.push``: run to completion), or
``LocalServingRuntime.apply`` between taking a lease from the ledger and recording it: raised there, the interrupt
was taken for a model failure (the worker stopped, the rollout served on until the end of its trace and ended
Failed) or could leave a lease unrecorded. So while a rollout serves, SIGINT only *asks* it to stop:
``interruptible()`` installs a handler that sets a flag (no lock: the handler runs between two bytecodes of the
main thread, which may hold any lock), the load generator checks it every turn (within one sleep: the next
arrival or beacon, at most ``beacon_s``) and the flow then raises KeyboardInterrupt itself, at a point where
closing the runtime stops the workers (queued requests dropped, not served) and gives every lease back. A second
SIGINT raises at once: the user insists. Off the main thread, where Python sets no handler, the default stays.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass
from typing import Iterator


@dataclass
class StopRequest:
    """Set by the SIGINT handler of ``interruptible``; read by the load generator at every turn."""

    requested: bool = False


@contextlib.contextmanager
def interruptible() -> Iterator[StopRequest]:
    """While the block runs, a first SIGINT sets ``requested`` on the yielded ``StopRequest`` instead of raising."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def ask_to_stop(signum: int, frame: object) -> None:
        if request.requested:
            raise KeyboardInterrupt
        request.requested = True

    previous = signal.signal(signal.SIGINT, ask_to_stop)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, previous)
