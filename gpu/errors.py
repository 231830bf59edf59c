"""Errors shared by the engine so every bad input fails with one clear message."""


class GpuflowsError(Exception):
    """Base class for errors raised by gpuflows."""


class ConfigError(GpuflowsError, ValueError):
    """A configuration or scenario value is invalid; the message names the field and the value."""

    def __init__(self, field: str, value: object, why: str):
        self.field = field
        self.value = value
        super().__init__(f"{field}={value!r}: {why}")


class NeverFitsError(GpuflowsError, ValueError):
    """A request can never be satisfied by the pool, even when it is empty."""


class AllocationTimeout(GpuflowsError, TimeoutError):
    """A request that could fit later did not get a placement within its timeout."""


class LedgerError(GpuflowsError, RuntimeError):
    """The pool ledger's file could not be read or written (disk full, locked, replaced); nothing was changed."""


class LedgerBusy(LedgerError):
    """Another process held the pool ledger's write lock for longer than this call could wait."""


class LedgerReplaced(LedgerError):
    """The pool ledger's file was deleted, truncated or replaced while processes still held the pool."""


class LeaseLost(GpuflowsError, RuntimeError):
    """A lease this process believed it held is no longer in the ledger (reclaimed or the pool was wiped)."""
