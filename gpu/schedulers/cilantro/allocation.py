"""Resource granularity and the round's allocation space 𝒜^(r) (thesis ch. 3, §3.4).

𝒜^(r) is ``Σ_j a_j ≤ R`` plus the box ``a_j^(r−1) − B ≤ a_j ≤ a_j^(r−1) + B`` that limits job
thrashing (B = 10 in the text; the authors' code has no box, so it is switchable). Policies work
in whole *units* (1 CPU, or a fraction of one for fractional granularity); this module turns a
real-valued target into a feasible unit vector: Euclidean projection onto the box ∩ budget
(one scalar shift found by ``scipy.optimize.brentq``), then floor + randomized rounding of the
remainders (the code's integerization, seeded RNG).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq

from gpu.schedulers.cilantro.types import Snapshot


def box_bounds(snapshot: Snapshot, min_units: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-job ``(lo, hi)`` in units: the ±B box around last round, inside ``[min_units, R]``."""
    n, total = snapshot.n, snapshot.units
    floor = min(min_units, total // n)
    lo = np.full(n, floor, dtype=int)
    hi = np.full(n, total, dtype=int)
    prev = snapshot.previous_units()
    if prev is not None and snapshot.max_change is not None:
        b = int(np.floor(snapshot.max_change / snapshot.unit + 1e-9))
        lo = np.maximum(lo, prev - b)
        hi = np.minimum(hi, prev + b)
        lo = np.minimum(lo, hi)
        if lo.sum() > total:  # the pool shrank below last round's floor: scale the floors down
            lo = np.floor(lo * total / lo.sum()).astype(int)
    return lo, hi


def project(target: np.ndarray, lo: np.ndarray, hi: np.ndarray, total: float) -> np.ndarray:
    """Closest point (L2) to ``target`` with ``lo ≤ x ≤ hi`` and ``Σ x ≤ total``."""
    x = np.clip(target, lo, hi)
    if x.sum() <= total + 1e-9:
        return x
    excess = lambda lam: np.clip(target - lam, lo, hi).sum() - total  # noqa: E731 - one-line root function
    lam = brentq(excess, 0.0, float(np.max(target - lo)) + 1.0, xtol=1e-10)
    return np.clip(target - lam, lo, hi)


def round_units(real: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Floor, then hand the leftover units out at random with probability ∝ the remainders."""
    base = np.floor(real + 1e-9).astype(int)
    frac = np.clip(real - base, 0.0, None)
    spare = min(int(round(real.sum())), total) - base.sum()
    if spare > 0 and frac.sum() > 0:
        picks = rng.choice(len(real), size=min(spare, int((frac > 0).sum())), replace=False, p=frac / frac.sum())
        base[picks] += 1
    return base


def fill_leftover(units: np.ndarray, hi: np.ndarray, total: int, order: np.ndarray) -> np.ndarray:
    """Give unused units to jobs with room, one at a time, cycling through ``order``."""
    units = units.copy()
    spare = total - units.sum()
    while spare > 0:
        room = [j for j in order if units[j] < hi[j]]
        if not room:
            break
        for j in room:
            if spare == 0:
                break
            units[j] += 1
            spare -= 1
    return units


def finalize(snapshot: Snapshot, target: np.ndarray, rng: np.random.Generator, *, fill: bool = True,
             min_units: int = 0) -> np.ndarray:
    """Make a real-valued target (in resource amounts, job order) a feasible unit vector.

    With ``fill`` the result uses the whole pool (jobs furthest below their target first).
    """
    lo, hi = box_bounds(snapshot, min_units)
    total = snapshot.units
    real = project(np.asarray(target, dtype=float) / snapshot.unit, lo, hi, total)
    units = np.clip(round_units(real, total, rng), lo, hi)
    if fill:
        units = fill_leftover(units, hi, total, np.argsort(units - real, kind="stable"))
    return units
