"""ORLOJ's line queue (§4.4.4): the top line at x always equals a brute-force argmax, through inserts, moves and
removals; and it agrees with the Eq. 4.2 scores it is built from."""

import numpy as np
import pytest

from gpu.schedulers.orloj.policy import Histogram, line_coefficients, priority_scores
from gpu.schedulers.orloj.hull import LineQueue


def test_the_top_line_is_the_brute_force_argmax_through_inserts_moves_and_removals():
    rng = np.random.default_rng(0)
    q, lines = LineQueue(), {}
    for step in range(2000):
        op = rng.random()
        if op < 0.55 or not lines:
            rid = int(rng.integers(0, 300))  # an existing id moves to a new line (a milestone)
            lines[rid] = (float(rng.normal()), float(rng.normal()))
            q.insert(rid, *lines[rid])
        elif op < 0.8:
            rid = list(lines)[int(rng.integers(len(lines)))]
            del lines[rid]
            q.remove(rid)
        else:
            x = float(rng.uniform(0.01, 5.0))
            best = max(lines.values(), key=lambda ab: ab[0] * x + ab[1])
            got = lines[q.top(x)]
            assert got[0] * x + got[1] == pytest.approx(best[0] * x + best[1], rel=1e-12)
        assert len(q) == len(lines)
    for rid in list(lines):
        q.remove(rid)
    assert q.top(1.0) is None and len(q) == 0


def test_the_queue_pops_requests_in_eq_4_2_order():
    rng = np.random.default_rng(1)
    lat = Histogram.from_samples(rng.gamma(4, 10, 3000), bins=40)
    b, t = 1e-3, 50.0
    deadlines = rng.uniform(60, 500, 40)
    alpha, beta, _ = line_coefficients(deadlines, t, lat, lat.mean, b)
    q = LineQueue()
    for i, (a, c) in enumerate(zip(alpha, beta)):
        q.insert(i, a, c)
    popped = q.pop(np.exp(b * t), 10)
    direct = priority_scores(deadlines - t, lat, lat.mean, b)
    assert np.allclose(sorted(direct[popped], reverse=True), sorted(direct, reverse=True)[:10])


def test_bulk_lines_from_qhull_give_the_brute_force_order():
    """A block of hundreds of lines (built by Qhull) and a few moved and removed: ``pop`` returns the k highest."""
    rng = np.random.default_rng(2)
    q = LineQueue()
    alpha, beta = rng.normal(size=500), rng.normal(size=500)
    q.insert_many(np.arange(500), alpha, beta)
    alpha[:50], beta[:50] = rng.normal(size=50), rng.normal(size=50)
    q.insert_many(np.arange(50), alpha[:50], beta[:50])  # moved at their milestones
    q.remove_many(np.arange(450, 500))
    x = 1.7
    values = alpha[:450] * x + beta[:450]
    assert q.pop(x, 20) == np.argsort(-values)[:20].tolist() and len(q) == 430
