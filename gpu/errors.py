"""Errors shared by the engine so every bad input fails with one clear message."""

import reprlib
from itertools import islice

ECHO_CHARS = 80  # how much of a bad value an error message shows


class _Echo(reprlib.Repr):
    """A ``repr`` that stops early: a YAML alias bomb is a few KB of text but a repr of billions of characters,
    and the full repr was built (800 MB) only to print it. Containers show a few items, nested a few levels."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother, self.maxlong = 3, ECHO_CHARS, ECHO_CHARS, ECHO_CHARS
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = self.maxdeque = 8

    def repr_dict(self, x: dict, level: int) -> str:
        """In the mapping's own order, like ``repr`` (reprlib sorts the keys)."""
        if not x or level <= 0:
            return "{...}" if x else "{}"
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in islice(x.items(), self.maxdict)]
        return "{" + ", ".join(items) + (", ...}" if len(x) > self.maxdict else "}")


_ECHO = _Echo()


def excerpt(value: object) -> str:
    """``repr(value)``, at most ECHO_CHARS characters (cut ones end in '…')."""
    try:
        text = _ECHO.repr(value)
    except ValueError:  # an int of more than 4,300 digits has no repr
        text = f"<{type(value).__name__}>"
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS - 1] + "…"


class GpuflowsError(Exception):
    """Base class for errors raised by gpuflows."""


class ConfigError(GpuflowsError, ValueError):
    """A configuration or scenario value is invalid; the message names the field and shows an excerpt of the value
    (``value`` keeps the whole of it)."""

    def __init__(self, field: str, value: object, why: str):
        self.field = field
        self.value = value
        super().__init__(f"{field}={excerpt(value)}: {why}")


class NeverFitsError(GpuflowsError, ValueError):
    """A request can never be satisfied by the pool, even when it is empty."""


class AllocationTimeout(GpuflowsError, TimeoutError):
    """A request that could fit later did not get a placement within its timeout."""


class LedgerError(GpuflowsError, RuntimeError):
    """The pool ledger's file could not be read or written (disk full, locked, replaced); nothing was changed."""


class LedgerBusy(LedgerError):
    """Another process held the pool ledger's write lock for longer than this call could wait."""


class LedgerBusyTimeout(LedgerBusy, AllocationTimeout):
    """``allocate``'s timeout ran out while another process held the pool's write lock: a LedgerBusy naming that
    process, and an AllocationTimeout to callers that only wait."""


class LedgerReplaced(LedgerError):
    """The pool ledger's file was deleted, truncated or replaced while processes still held the pool."""


class LeaseLost(GpuflowsError, RuntimeError):
    """A lease this process believed it held is no longer in the ledger (reclaimed or the pool was wiped)."""
