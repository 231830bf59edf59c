"""Asynchronous successive halving (ASHA; Li et al., MLSys 2020): hands out work whenever slots open.

Rungs ``r_k = min_budget * eta**k`` (the last one capped at ``max_budget``). When asked for work, ASHA
promotes a config from the highest rung where it is in the top ``1/eta`` of that rung's finished results and
not yet promoted; otherwise it starts a new config on rung 0 until ``num_samples`` configs were started. The
batch handed out in one ``suggest(slots)`` call is one TrialGroup (FLUID, thesis §3.3.2). Finished when no
new config is left, nothing is promotable and nothing is running.

Bookkeeping is ours (numpy/python): Ray Tune's ``AsyncHyperBandScheduler`` decides CONTINUE/STOP on each
reported result of trials that ``tune.run`` launches; it cannot hand out a batch of promotions to FLUID.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import Trial, TrialGroup
from gpu.schedulers.fluid.tuning.base import ConfigSampler, RandomSampler, TuningAlgorithm, check_budget, check_count
from gpu.schedulers.fluid.tuning.space import Space


class ASHA(TuningAlgorithm):
    """Asynchronous successive halving over ``num_samples`` configs (single bracket, as Ray's default)."""

    name = "asha"

    def __init__(self, space: Space, num_samples: int, max_budget: float, min_budget: float = 1.0, eta: int = 3,
                 seed: int = 0, sampler: ConfigSampler | None = None):
        super().__init__()
        self.num_samples = check_count(num_samples, "num_samples")
        max_b, min_b = check_budget(max_budget, "max_budget"), check_budget(min_budget, "min_budget")
        if min_b > max_b:
            raise ConfigError("min_budget", min_budget, f"must be <= max_budget={max_budget}")
        self.eta = check_count(eta, "eta", 2)
        self.rungs = [min_b]
        while self.rungs[-1] * self.eta < max_b - 1e-9:
            self.rungs.append(self.rungs[-1] * self.eta)
        if self.rungs[-1] < max_b:
            self.rungs.append(max_b)
        self.sampler = sampler or RandomSampler(space, np.random.default_rng(seed))
        self._configs: dict[str, dict[str, Any]] = {}
        self._rung_scores: list[dict[str, float]] = [{} for _ in self.rungs]
        self._promoted: list[set[str]] = [set() for _ in self.rungs]
        self._last_trial: dict[str, str] = {}

    def _promotable(self) -> tuple[str, int] | None:
        for k in range(len(self.rungs) - 2, -1, -1):
            scores = self._rung_scores[k]
            top = sorted(scores, key=scores.get)[: len(scores) // self.eta]
            for cid in top:
                if cid not in self._promoted[k]:
                    return cid, k + 1
        return None

    def suggest(self, slots: int) -> TrialGroup | None:
        trials = []
        while len(trials) < slots:
            job = self._promotable()
            if job is not None:
                cid, rung = job
                self._promoted[rung - 1].add(cid)
            elif len(self._configs) < self.num_samples:
                cid, rung = f"c{len(self._configs):04d}", 0
                self._configs[cid] = self.sampler.sample(1)[0]
            else:
                break
            start = self.rungs[rung - 1] if rung else 0.0
            trial = Trial(f"{cid}@{rung}", self.rungs[rung] - start, self._configs[cid], resume_from=start,
                          checkpoint=self._last_trial.get(cid) if rung else None)
            self._last_trial[cid] = trial.trial_id
            trials.append(trial)
        return self._group(trials) if trials else None

    def on_trial_complete(self, trial_id: str, score: float) -> None:
        super().on_trial_complete(trial_id, score)
        cid, rung = trial_id.split("@")
        self._rung_scores[int(rung)][cid] = float(score)
        r = self.results[-1]
        self.sampler.observe(r.config, r.iterations, r.score)

    @property
    def finished(self) -> bool:
        return len(self._configs) >= self.num_samples and not self.pending and self._promotable() is None
