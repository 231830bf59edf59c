"""Evolutionary welfare search (thesis ch. 3, §3.4 "evolutionary algorithm", baselines EvoAlg-SW/-EW, §3.7).

:func:`evolve` is the authors' optimizer (``evo_opt.py``; the appendix with its details is not in
the thesis text): keep an archive of (allocation, value); each epoch draw 5 parents with
probability ∝ exp(z-score of value) and mutate each — w.p. 0.25 move one unit between two random
jobs 2–5 times, w.p. 0.75 add N(0, 0.1²) noise to the normalised above-minimum shares — keeping
≥ ``min_units`` per job. Candidates are scored in batches (one vectorised call per epoch).

:class:`EvoAlgPolicy` is the paper's EvoAlg baseline: the same search, but scored on the welfare
*observed* in feedback, one allocation per round, with no performance model.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from gpu.schedulers.cilantro.allocation import finalize
from gpu.schedulers.cilantro.metrics import egalitarian_welfare, social_welfare
from gpu.schedulers.cilantro.types import Allocation, AllocationPolicy, Snapshot, as_allocation


def _split(shares: np.ndarray, total: int, min_units: int) -> np.ndarray:
    """Normalised shares → integer units with ``min_units`` each (largest remainders)."""
    spare = total - min_units * shares.shape[-1]
    real = spare * shares / shares.sum(axis=-1, keepdims=True)
    units = np.floor(real).astype(int)
    short = spare - units.sum(axis=-1)
    order = np.argsort(-(real - units), axis=-1)
    for row in range(units.shape[0]):
        units[row, order[row, : short[row]]] += 1
    return units + min_units


def mutate(parent: np.ndarray, total: int, min_units: int, rng: np.random.Generator) -> np.ndarray:
    """One offspring of ``parent`` (integer units summing to ``total``)."""
    child = parent.copy()
    n = len(child)
    if rng.random() < 0.25:
        for _ in range(rng.integers(2, 6)):
            src, dst = rng.choice(n, size=2, replace=False)
            if child[src] > min_units:
                child[src] -= 1
                child[dst] += 1
        return child
    shares = (child - min_units) / max(total - min_units * n, 1)
    shares = np.clip(shares + rng.normal(0.0, 0.1, n), 0.0, None) + 1e-12
    return _split(shares[None, :], total, min_units)[0]


def evolve(objective: Callable[[np.ndarray], np.ndarray], n: int, total: int, rng: np.random.Generator, *,
           iterations: int = 2000, min_units: int = 1, seeds: np.ndarray | None = None, parents: int = 5) -> np.ndarray:
    """Maximise ``objective`` (batch of unit vectors → values) over integer splits of ``total``."""
    init = [np.full(n, total // n) + (np.arange(n) < total % n)]
    init += list(_split(rng.random((max(10, 2 * n) - 1, n)), total, min_units))
    if seeds is not None:
        init += list(np.atleast_2d(seeds))
    pop = np.array(init, dtype=int)
    vals = np.asarray(objective(pop), dtype=float)
    for _ in range(max(1, iterations // parents)):
        z = (vals - vals.mean()) / (vals.std() + 1e-12)
        p = np.exp(z - z.max())
        picks = rng.choice(len(pop), size=parents, p=p / p.sum())
        kids = np.array([mutate(pop[i], total, min_units, rng) for i in picks])
        pop = np.vstack([pop, kids])
        vals = np.concatenate([vals, objective(kids)])
    return pop[int(np.argmax(vals))]


class EvoAlgPolicy(AllocationPolicy):
    """EvoAlg-SW / EvoAlg-EW: evolutionary search on observed welfare, one proposal per round."""

    learner = "none"

    def __init__(self, name: str = "evoalg-sw", objective: str = "social", min_units: int = 1):
        self.name, self.objective, self.min_units = name, objective, min_units
        self._archive: list[tuple[list[int], float]] = []

    def decide(self, snapshot: Snapshot, rng: np.random.Generator) -> Allocation:
        prev = snapshot.previous_units()
        fb = [j.feedback for j in snapshot.jobs]
        if prev is not None and all(f is not None for f in fb):
            utils = [j.spec.utility_of(f.perf) for j, f in zip(snapshot.jobs, fb)]
            welfare = social_welfare(utils) if self.objective == "social" else egalitarian_welfare(utils)
            self._archive.append((prev.tolist(), float(welfare)))
        if not self._archive:
            return as_allocation(snapshot, finalize(snapshot, np.full(snapshot.n, snapshot.capacity / snapshot.n), rng))
        pop = np.array([a for a, _ in self._archive], dtype=float)
        vals = np.array([v for _, v in self._archive])
        z = (vals - vals.mean()) / (vals.std() + 1e-12)
        p = np.exp(z - z.max())
        parent = pop[rng.choice(len(pop), p=p / p.sum())].astype(int)
        parent = _split(np.maximum(parent - self.min_units, 0)[None, :] + 1e-12, snapshot.units, self.min_units)[0]
        child = mutate(parent, snapshot.units, self.min_units, rng)
        return as_allocation(snapshot, finalize(snapshot, child * snapshot.unit, rng, min_units=self.min_units))

    def get_state(self) -> dict[str, Any]:
        return {"archive": [[a, v] for a, v in self._archive]}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._archive = [([int(u) for u in a], float(v)) for a, v in state.get("archive", [])]
