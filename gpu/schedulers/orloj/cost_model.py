"""ORLOJ's cost model of a padded batch (Yu 2022, §4.3, Eq. 4.3/4.4): a batch runs as long as its slowest request.

ORLOJ's policy (``policy.py``) prices candidate batches with it, its profiler (``profiler.py``) inverts it to
recover alone times from measured batches, and a simulator of a dynamic model uses it as the
``gpu.batching.BatchCostModel`` of its batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from gpu.errors import ConfigError


@dataclass(frozen=True)
class PaddedBatchModel:
    """How long a batch of requests with known alone times runs: ORLOJ Eq. 4.3/4.4.

    ``l_B = c0 + c1·k·max_r l_r``: requests are padded to the longest one, so a batch costs its slowest
    request ``k`` times plus a fixed overhead ``c0``. A request's alone time is the batch of one,
    ``a_r = c0 + c1·l_r``, so in alone times ``l_B = c0 + k·max_r (a_r − c0)`` and ``c1`` cancels: only ``c0``
    is a parameter (the thesis leaves it to profiling; ``docs/orloj.md`` says how the simulator picks it).

    ``growth`` replaces the factor ``k`` by a measured one, ``g(k)`` for k = 1, 2, … (``g(1) = 1``), for hardware
    on which a batch's cost grows sublinearly in its size (a GPU, or a tiny model on a CPU): see
    :meth:`from_profile`. ``fixed_growth`` does the same for the batch-independent part, ``c0·h(k)`` with
    ``h(1) = 1`` (a measured profile's fixed part also grows a little with the batch: its embedding and
    head run on every row; ``gpu.sim.orloj.batch_cost``). Times in ms.
    """

    c0: float = 0.0
    growth: tuple[float, ...] = ()
    fixed_growth: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (np.isfinite(self.c0) and self.c0 >= 0):
            raise ConfigError("c0", self.c0, "need a finite batch overhead >= 0 ms")
        for name in ("growth", "fixed_growth"):
            g = np.asarray(getattr(self, name), float)
            if g.size and not (np.all(np.isfinite(g)) and g[0] == 1.0 and np.all(np.diff(g) >= 0)):
                raise ConfigError(name, getattr(self, name), "need g(1) = 1 and a finite, nondecreasing g(k)")

    @classmethod
    def from_profile(cls, latency_ms: Callable[[int], float], max_batch: int, c0: float) -> "PaddedBatchModel":
        """Fit ``g(k) = (ℓ(k) − c0) / (ℓ(1) − c0)`` from a measured profile ℓ(k) of padded batches."""
        base = latency_ms(1) - c0
        if not base > 0:
            raise ConfigError("c0", c0, f"must be below the batch-of-one latency {latency_ms(1):.4g} ms")
        g = np.maximum.accumulate([max(1.0, (latency_ms(k) - c0) / base) for k in range(1, max_batch + 1)])
        g[0] = 1.0
        return cls(c0, tuple(float(v) for v in g))

    def factor(self, k: int) -> float:
        """How many alone-time works a batch of ``k`` costs: ``k`` (Eq. 4.3) or the measured ``g(k)``."""
        return _grown(self.growth, k, float(k))

    def fixed(self, k: int) -> float:
        """The batch-independent part of a batch of ``k``: ``c0`` (Eq. 4.3) or ``c0·h(k)``, measured."""
        return self.c0 * _grown(self.fixed_growth, k, 1.0)

    def batch_ms(self, alone_ms: Sequence[float] | np.ndarray) -> float:
        """Execution time of one batch whose requests alone take ``alone_ms`` (Eq. 4.3 with Eq. 4.4)."""
        alone = np.asarray(alone_ms, float)
        return self.fixed(len(alone)) + self.factor(len(alone)) * max(0.0, float(alone.max()) - self.c0)


def _grown(table: tuple[float, ...], k: int, default: float) -> float:
    """A measured growth at ``k``, linear beyond the table (``default`` without one)."""
    if not table:
        return default
    return table[k - 1] if k <= len(table) else table[-1] * k / len(table)
