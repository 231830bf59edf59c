"""ORLOJ's online profiler (Yu 2022, §4.3.2): per-application alone times of sampled finished requests.

"Finished requests are sampled and send to the profiler to evaluate individually. The execution time data will
then be asynchronously picked up and accumulated by the scheduler periodically, completely off the critical
path. In order to adapt to drifts in the input, ORLOJ resets its profiling memory every once a while."

The thesis gives no sampling rate, pick-up period or window; the defaults here (10 % of finished requests, a
10-minute sliding window) are ours (``docs/orloj.md``). The world times the sampled requests alone (the
simulator reads their true alone times) and hands them to ``OrlojController.on_epoch`` at its next epoch
boundary, which calls :meth:`OnlineProfiler.record` and :meth:`OnlineProfiler.publish`, whose histograms the policy
adopts (``OrlojPolicy.update_histograms``). No clock is read: the caller passes ``now``.

A serving worker measures every batch it runs instead, without stopping to time requests alone: a padded batch
of ``k`` runs as long as its slowest request (Eq. 4.3/4.4), so :func:`longest_alone_ms` turns the batch's time
back into the longest alone time among its ``k`` requests, and ``record(..., batch=k)`` keeps it as such. The
longest of ``k`` independent draws has the CDF ``F^k`` (Eq. 4.6), so :func:`histogram_from_maxima` recovers
``F`` as ``G_k^{1/k}`` from the maxima's empirical CDF ``G_k`` of each batch size, averaged over the sizes by
their counts; batches of one are alone times as they are.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.errors import ConfigError
from gpu.schedulers.orloj.policy import Histogram


def longest_alone_ms(batch_ms: float, k: int, model: PaddedBatchModel) -> float:
    """Eq. 4.3 solved for the batch's longest alone time: ``c0 + (l_B − c0·h(k)) / g(k)`` (at least 0 ms).

    Example: ``c0 = 1`` ms, ``g(4) = 4``, a batch of 4 that ran 9 ms → its slowest request takes 3 ms alone.
    """
    return max(0.0, model.c0 + (batch_ms - model.fixed(k)) / model.factor(k))


def histogram_from_maxima(maxima: Mapping[int, Sequence[float]], bins: int = 200) -> Histogram:
    """The per-request alone-time histogram behind the longest alone times of batches of each size ``k``.

    ``F(x) = Σ_k n_k·G_k(x)^{1/k} / Σ_k n_k`` on ``bins`` equal-width bins over the observed range (Eq. 4.6
    inverted: the longest of ``k`` independent requests has CDF ``F^k``). With only batches of one this is
    ``Histogram.from_samples``.
    """
    sizes = {int(k): np.asarray(v, float) for k, v in maxima.items() if len(v)}
    if set(sizes) <= {1}:
        return Histogram.from_samples(sizes.get(1, np.array([])), bins)
    everything = np.concatenate(list(sizes.values()))
    lo, hi = float(everything.min()), float(everything.max())
    if hi - lo <= 1e-9 * max(1.0, hi):
        lo, hi = lo * 0.999, hi * 1.001 + 1e-9
    edges = np.linspace(lo, hi, bins + 1)
    cdf = sum(len(x) * (np.searchsorted(np.sort(x), edges, side="right") / len(x)) ** (1.0 / k)
              for k, x in sizes.items()) / len(everything)
    masses = np.diff(cdf)
    masses[0] += cdf[0]
    return Histogram(edges, np.clip(masses, 0.0, None))


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

    def record(self, now_ms: float, app: str, alone_ms: float, batch: int = 1) -> None:
        """One measured alone time of a request of ``app``, taken at ``now_ms``; with ``batch = k``, the longest
        alone time among the ``k`` requests of one batch (``longest_alone_ms``)."""
        if not (np.isfinite(alone_ms) and alone_ms >= 0):
            raise ConfigError("alone_ms", alone_ms, "need a finite time >= 0 ms")
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ConfigError("batch", batch, "need a whole batch size >= 1")
        self._samples.setdefault(app, deque()).append((now_ms, int(batch), alone_ms))

    def publish(self, now_ms: float) -> dict[str, Histogram]:
        """Histograms of the measurements within the window, per application with enough of them."""
        out = {}
        for app, q in self._samples.items():
            while q and q[0][0] < now_ms - self.window_ms:
                q.popleft()
            if len(q) >= self.min_samples:
                maxima: dict[int, list[float]] = {}
                for _, k, ms in q:
                    maxima.setdefault(k, []).append(ms)
                out[app] = histogram_from_maxima(maxima, self.bins)
        return out
