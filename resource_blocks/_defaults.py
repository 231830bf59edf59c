"""Loading a saved block by name, or the block's defaults when no name is given."""

from __future__ import annotations

from typing import TypeVar

from prefect.blocks.core import Block

from gpu.errors import ConfigError

B = TypeVar("B", bound=Block)


def load_or_default(cls: type[B], name: str | None) -> B:
    """``cls.load(name)`` for a name, ``cls()`` without one.

    A name with no saved block is an error, not the defaults: a typo in a pool name would otherwise run the
    job on a different (simulated) pool without a word.
    """
    if not name:
        return cls()
    try:
        return cls.load(name)
    except ValueError as exc:
        raise ConfigError(cls.get_block_type_slug(), name,
                          f"no saved block of that name; save one first (e.g. `{cls.__name__}(...).save({name!r})`) "
                          f"or leave the name out for the defaults") from exc
