"""ORLOJ's online profiler (Yu 2022, §4.3.2): per-application alone times of sampled finished requests.

"Finished requests are sampled and send to the profiler to evaluate individually. The execution time data will
then be asynchronously picked up and accumulated by the scheduler periodically, completely off the critical
path. In order to adapt to drifts in the input, ORLOJ resets its profiling memory every once a while."

The thesis gives no sampling rate, pick-up period or window; the defaults here (10 % of finished requests, a
10-minute sliding window) are ours (``docs/orloj.md``). The world times the sampled requests alone (the
simulator reads their true alone times; the serving flow runs them one by one on a pool slice) and calls
:meth:`OnlineProfiler.record`; :meth:`OnlineProfiler.publish` returns the histograms the policy adopts
(``OrlojPolicy.update_histograms``). No clock is read: the caller passes ``now``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.orloj.policy import Histogram


@dataclass
class OnlineProfiler:
    """Samples finished requests, keeps their alone times for ``window_ms``, publishes per-app histograms.

    Args:
        sample_rate: the share of finished requests to time alone.
        window_ms: how long a measurement stays in the profile (older ones are forgotten at ``publish``).
        min_samples: an application with fewer measurements in the window publishes no histogram (the policy
            then uses the model-wide one, or keeps its last).
        bins: histogram bins.
        seed: the sampling RNG's seed.
    """

    sample_rate: float = 0.1
    window_ms: float = 600_000.0
    min_samples: int = 20
    bins: int = 200
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)
    _samples: dict[str, deque] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.sample_rate <= 1:
            raise ConfigError("sample_rate", self.sample_rate, "need a share in (0, 1]")
        if not self.window_ms > 0:
            raise ConfigError("window_ms", self.window_ms, "need a window > 0 ms")
        if self.min_samples < 1 or self.bins < 1:
            raise ConfigError("min_samples", (self.min_samples, self.bins), "need min_samples and bins >= 1")
        self._rng = np.random.default_rng(self.seed)

    def choose(self, request_ids: Sequence[int]) -> list[int]:
        """Which of a finished batch's requests to time alone (each with probability ``sample_rate``)."""
        keep = self._rng.random(len(request_ids)) < self.sample_rate
        return [r for r, k in zip(request_ids, keep) if k]

    def record(self, now_ms: float, app: str, alone_ms: float) -> None:
        """One measured alone time of a request of ``app``, taken at ``now_ms``."""
        if not (np.isfinite(alone_ms) and alone_ms >= 0):
            raise ConfigError("alone_ms", alone_ms, "need a finite time >= 0 ms")
        self._samples.setdefault(app, deque()).append((now_ms, alone_ms))

    def publish(self, now_ms: float) -> dict[str, Histogram]:
        """Histograms of the measurements within the window, per application with enough of them."""
        out = {}
        for app, q in self._samples.items():
            while q and q[0][0] < now_ms - self.window_ms:
                q.popleft()
            if len(q) >= self.min_samples:
                out[app] = Histogram.from_samples([a for _, a in q], self.bins)
        return out
