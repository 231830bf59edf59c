"""Loading a saved block by name, or the block's defaults when none was saved."""

from __future__ import annotations

from typing import TypeVar

from prefect.blocks.core import Block

B = TypeVar("B", bound=Block)


def load_or_default(cls: type[B], name: str | None) -> B:
    """``cls.load(name)`` when a block of that name is saved, else ``cls()``."""
    if name:
        try:
            return cls.load(name)
        except ValueError:
            pass
    return cls()
