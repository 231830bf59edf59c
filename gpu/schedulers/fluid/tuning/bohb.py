"""BOHB-style tuning (Falkner et al., ICML 2018): Hyperband/ASHA with a density-model config sampler.

``KDESampler`` follows BOHB's model: on the largest budget with enough observations it splits results into
good (best ``top_fraction``) and bad, fits a kernel density to each (``scipy.stats.gaussian_kde`` on the
unit-cube encoding; categoricals by index, a simplification of BOHB's Aitchison–Aitken kernel), draws
candidates from the good density and keeps the one maximising ``l(x) / g(x)``. A ``random_fraction`` of
configs stays uniformly random. ``SyncBOHB`` = synchronous Hyperband + this sampler (one TrialGroup per
rung), ``BOHB`` = ASHA + this sampler (asynchronous), as in the thesis's evaluation (§3.6).

Ray Tune's ``TuneBOHB`` needs ``hpbandster``/``ConfigSpace``, which are not installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import gaussian_kde

from gpu.schedulers.fluid.tuning.asha import ASHA
from gpu.schedulers.fluid.tuning.hyperband import Hyperband
from gpu.schedulers.fluid.tuning.space import Space, decode, dimensions, encode, sample, validate_space


class KDESampler:
    """BOHB's config model: sample where good configs are dense and bad ones are not."""

    def __init__(self, space: Space, rng: np.random.Generator, top_fraction: float = 0.15,
                 random_fraction: float = 1 / 3, candidates: int = 64):
        self.space = validate_space(space)
        self.rng = rng
        self.top_fraction, self.random_fraction, self.candidates = top_fraction, random_fraction, candidates
        self._obs: dict[float, list[tuple[np.ndarray, float]]] = {}

    def observe(self, config: dict[str, Any], budget: float, score: float) -> None:
        self._obs.setdefault(budget, []).append((encode(self.space, config), float(score)))

    def _model(self) -> tuple[gaussian_kde, gaussian_kde] | None:
        dims = dimensions(self.space)
        for budget in sorted(self._obs, reverse=True):
            obs = sorted(self._obs[budget], key=lambda o: o[1])
            n_good = max(dims + 1, int(self.top_fraction * len(obs)))
            if len(obs) - n_good < dims + 1:
                continue
            good = np.array([x for x, _ in obs[:n_good]]).T
            bad = np.array([x for x, _ in obs[n_good:]]).T
            try:
                return gaussian_kde(good), gaussian_kde(bad)
            except np.linalg.LinAlgError:  # degenerate (e.g. identical good configs): try a smaller budget
                continue
        return None

    def sample(self, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            model = None if self.rng.random() < self.random_fraction else self._model()
            if model is None:
                out.append(sample(self.space, 1, self.rng)[0])
                continue
            good, bad = model
            cand = np.clip(good.resample(self.candidates, seed=self.rng), 0.0, 1.0)
            ratio = good(cand) / np.maximum(bad(cand), 1e-12)
            out.append(decode(self.space, cand[:, int(np.argmax(ratio))]))
        return out


class SyncBOHB(Hyperband):
    """Synchronous BOHB: Hyperband brackets, configs from ``KDESampler``."""

    name = "syncbohb"

    def __init__(self, space: Space, max_budget: float, min_budget: float = 1.0, eta: int = 3, seed: int = 0):
        super().__init__(space, max_budget, min_budget, eta, seed, KDESampler(space, np.random.default_rng(seed)))


class BOHB(ASHA):
    """Asynchronous BOHB: ASHA promotions, configs from ``KDESampler``."""

    name = "bohb"

    def __init__(self, space: Space, num_samples: int, max_budget: float, min_budget: float = 1.0, eta: int = 3,
                 seed: int = 0):
        super().__init__(space, num_samples, max_budget, min_budget, eta, seed,
                         KDESampler(space, np.random.default_rng(seed)))
