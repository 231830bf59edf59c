"""Errors shared by the engine so every bad input fails with one clear message."""

import reprlib

ECHO_CHARS = 80  # how much of a bad value an error message shows


def _echo_repr() -> reprlib.Repr:
    """A ``repr`` that stops early: a YAML alias bomb is a few KB of text but a repr of billions of characters,
    and the full repr was built (800 MB) only to print it. Containers show a few items, nested a few levels."""
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, ECHO_CHARS, ECHO_CHARS, ECHO_CHARS
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 8
    return r


_ECHO = _echo_repr()


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
