"""ORLOJ's line queue (§4.4.4): the top line at x always equals a brute-force argmax, through inserts, moves and
removals; and it agrees with the Eq. 4.2 scores it is built from."""

import numpy as np

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
            assert got[0] * x + got[1] == best[0] * x + best[1]
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
    popped = []
    for _ in range(10):
        popped.append(q.top(np.exp(b * t)))
        q.remove(popped[-1])
    direct = priority_scores(deadlines - t, lat, lat.mean, b)
    assert np.allclose(sorted(direct[popped], reverse=True), sorted(direct, reverse=True)[:10])
