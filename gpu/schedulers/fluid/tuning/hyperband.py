"""Synchronous successive halving and Hyperband: one TrialGroup per rung (FLUID, thesis §3.3.2: a TrialGroup is the set of trials a tuning algorithm hands out together).

Li et al., "Hyperband" (JMLR 2018). A bracket ``(n, R, eta, s)`` trains ``n`` configs for
``r_0 = R * eta**-s`` iterations, keeps the best ``floor(n_i / eta)`` (at least one) and trains them on to
``r_{i+1} = r_i * eta`` from their checkpoints, until ``r_s = R``. Hyperband runs brackets
``s = s_max .. 0`` one after another with ``n = ceil((s_max + 1) / (s + 1) * eta**s)``.

Bookkeeping is ours (numpy): Ray Tune's ``HyperBandScheduler`` answers CONTINUE/PAUSE/STOP per reported
result and needs a ``TuneController`` and ``Trial`` objects, so it cannot be driven outside ``tune.run``
to form TrialGroups.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import Trial, TrialGroup
from gpu.schedulers.fluid.tuning.base import ConfigSampler, RandomSampler, TuningAlgorithm, check_budget, check_count
from gpu.schedulers.fluid.tuning.space import Space


class _Bracket:
    """One successive-halving bracket: which configs are alive and which rung they are on.

    >>> b = _Bracket(n=9, max_budget=9, eta=3, s=2); b.rung_budgets
    [1.0, 3.0, 9.0]
    """

    def __init__(self, n: int, max_budget: float, eta: int, s: int):
        self.n, self.eta, self.s = n, eta, s
        self.rung_budgets = [max_budget * float(eta) ** (i - s) for i in range(s + 1)]
        self.rung = -1
        self.alive: list[str] = []  # config ids on the current rung
        self.scores: dict[str, float] = {}

    def next_rung(self) -> tuple[int, list[str]] | None:
        """Advance to the next rung: (rung index, config ids to train), or None when the bracket is done."""
        if self.rung == self.s:
            return None
        if self.rung >= 0:
            keep = max(1, len(self.alive) // self.eta)
            self.alive = sorted(self.alive, key=lambda c: self.scores[c])[:keep]
        self.rung += 1
        self.scores = {}
        return self.rung, list(self.alive)


class Hyperband(TuningAlgorithm):
    """Synchronous Hyperband: brackets in sequence, each rung one TrialGroup.

    Args:
        space: search space.
        max_budget: ``R``, iterations of a fully trained config.
        min_budget: smallest rung budget (sets ``s_max = floor(log_eta(R / min_budget))``).
        eta: reduction factor (>= 2).
        seed: seeds the config sampler.
        sampler: where configs come from (default random; BOHB passes its density model).
        brackets: which ``s`` values to run (default all, ``s_max .. 0``).
    """

    name = "hyperband"

    def __init__(self, space: Space, max_budget: float, min_budget: float = 1.0, eta: int = 3, seed: int = 0,
                 sampler: ConfigSampler | None = None, brackets: list[tuple[int, int]] | None = None):
        super().__init__()
        self.max_budget = check_budget(max_budget, "max_budget")
        min_b = check_budget(min_budget, "min_budget")
        if min_b > self.max_budget:
            raise ConfigError("min_budget", min_budget, f"must be <= max_budget={max_budget}")
        self.eta = check_count(eta, "eta", 2)
        self.sampler = sampler or RandomSampler(space, np.random.default_rng(seed))
        s_max = int(math.floor(math.log(self.max_budget / min_b, self.eta) + 1e-9))
        self._plan = brackets if brackets is not None else [
            (int(math.ceil((s_max + 1) / (s + 1) * self.eta**s)), s) for s in range(s_max, -1, -1)]
        self._bracket: _Bracket | None = None
        self._configs: dict[str, dict[str, Any]] = {}
        self._last_trial: dict[str, str] = {}

    def suggest(self, slots: int) -> TrialGroup | None:
        if self.pending:
            return None
        while True:
            if self._bracket is None:
                if not self._plan:
                    return None
                n, s = self._plan.pop(0)
                self._bracket = _Bracket(n, self.max_budget, self.eta, s)
                for cfg in self.sampler.sample(n):
                    cid = f"c{len(self._configs):04d}"
                    self._configs[cid] = cfg
                    self._bracket.alive.append(cid)
            nxt = self._bracket.next_rung()
            if nxt is None:
                self._bracket = None
                continue
            rung, cids = nxt
            return self._group([self._trial(cid, rung) for cid in cids])

    def _trial(self, cid: str, rung: int) -> Trial:
        budgets = self._bracket.rung_budgets
        start = budgets[rung - 1] if rung else 0.0
        trial = Trial(f"{cid}@{self._bracket.s}.{rung}", budgets[rung] - start, self._configs[cid],
                      resume_from=start, checkpoint=self._last_trial.get(cid) if rung else None)
        self._last_trial[cid] = trial.trial_id
        return trial

    def on_trial_complete(self, trial_id: str, score: float) -> None:
        super().on_trial_complete(trial_id, score)
        cid = trial_id.split("@")[0]
        self._bracket.scores[cid] = float(score)
        r = self.results[-1]
        self.sampler.observe(r.config, r.iterations, r.score)

    @property
    def finished(self) -> bool:
        return not self._plan and not self.pending and (self._bracket is None or self._bracket.rung == self._bracket.s)


class SuccessiveHalving(Hyperband):
    """One synchronous successive-halving bracket: ``num_samples`` configs from ``min_budget`` up to ``max_budget``."""

    name = "sh"

    def __init__(self, space: Space, num_samples: int, max_budget: float, min_budget: float = 1.0, eta: int = 3,
                 seed: int = 0, sampler: ConfigSampler | None = None):
        n = check_count(num_samples, "num_samples")
        super().__init__(space, max_budget, min_budget, eta, seed, sampler, brackets=[])
        s = int(math.floor(math.log(self.max_budget / min_budget, self.eta) + 1e-9))
        self._plan = [(n, s)]
