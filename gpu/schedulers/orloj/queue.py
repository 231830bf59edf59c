"""ORLOJ's pending requests of one worker, kept as Algorithm 4.1 keeps them (Yu 2022, §4.4.3–§4.4.4).

``OrlojPolicy.decide`` scores the whole queue at every decision (an O(n·bins) scan over request objects). A
controller that owns its queue keeps it here instead (``OrlojController``, in the simulator and in every serving
worker), and each decision does only what changed:

* lines 1–9: a request's Eq. 4.2 score is the line ``α·e^{b·t} + β`` until its next milestone (the next bin edge
  of ``L_B`` its slack crosses); only requests whose milestone passed get a new line, found in O(log bins) from
  prefix sums over the bins (``_LineTable``), and the lines go to a ``LineQueue`` per batch size in one block.
  Times are relative to a base time that is reset once ``b·(t − base)`` passes ``RESET_EXPONENT`` (every line is
  then recomputed, lines 2–4);
* lines 10–14: each request's ``E[L_B(bs)]`` is kept per batch size, so viability and timeouts are one
  vectorised comparison; a request leaves ``Q_bs`` for good once it is too late for ``bs``;
* lines 15–21: counts and earliest deadlines per ``Q_bs``;
* line 22: PopBatch takes the ``bs`` highest lines at ``x = e^{b·(t − base)}`` from the chosen queue.

Lines are kept only for the batch sizes a decision picked (lazily, all milestones of a newly picked size at once):
at a steady load the same size is picked again and again. The decisions equal ``OrlojPolicy.decide``'s up to the
order of exactly tied scores (``tests/schedulers/test_orloj_queue.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu.batching import InferenceRequest
from gpu.schedulers.orloj.hull import LineQueue
from gpu.schedulers.orloj.policy import PER_APP, RESET_EXPONENT, Histogram, OrlojPolicy


@dataclass(frozen=True, eq=False)
class _LineTable:
    """Eq. 4.2's line for one ``L_B`` histogram and one cost step, in O(log bins) per request.

    With slack ``s = D − t`` inside bin ``j − 1`` (``e_{j−1} < s ≤ e_j``): bins below are in case 1 and sum to
    ``e^{−b·s}·P_{j−1}`` with the prefix sums ``P_n = Σ_{i<n} k_i (e^{b·e_{i+1}} − e^{b·e_i})``, bin ``j − 1`` is
    in case 2, the rest score 0. Every exponent is taken relative to the top edge ``E`` (no overflow).
    """

    edges: np.ndarray
    k: np.ndarray  # h_i·c/(E[L]·b) per bin
    prefix: np.ndarray  # P'_n = Σ_{i<n} k_i (e^{b(e_{i+1} − E)} − e^{b(e_i − E)}), n = 0..bins
    lower: np.ndarray  # e^{b(e_i − E)} per bin
    offset: float  # the cost step's offset after the deadline
    b: float

    @classmethod
    def build(cls, latency: Histogram, mean: float, b: float, offset: float, cost: float) -> "_LineTable":
        e = latency.edges
        k = latency.density * cost / (mean * b)
        grown = np.exp(b * (e - e[-1]))
        prefix = np.concatenate([[0.0], np.cumsum(k * np.diff(grown))])
        return cls(e, k, prefix, grown[:-1], offset, b)

    def lines(self, deadline_rel: np.ndarray, t_rel: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(α, β, milestone_rel)`` of requests due at ``deadline_rel`` at ``t_rel`` (same base)."""
        d = deadline_rel + self.offset
        j = np.searchsorted(self.edges, d - t_rel, side="left")  # edges[:j] < s <= edges[j:]
        bins = len(self.k)
        inside = (j >= 1) & (j <= bins)
        below = np.clip(j - 1, 0, bins - 1)
        prev = np.clip(j - 1, 0, bins)  # the edge the slack crosses next
        k = np.where(inside, self.k[below], 0.0)
        alpha = np.where(j >= 1, np.exp(-self.b * (d - self.edges[-1])) * (self.prefix[prev] - k * self.lower[below]),
                         0.0)
        return alpha, k, np.where(j >= 1, d - self.edges[prev], np.inf)


class OrlojQueue:
    """One worker's ORLOJ queue: add requests as they arrive, ``decide`` one batch at a time (Alg. 4.1).

    Args:
        policy: the worker's ``OrlojPolicy`` (its histograms, batch sizes, ``b``, mix and cost steps; when its
            histograms are replaced, ``update_histograms``, the next decision re-derives every estimate and line).
    """

    def __init__(self, policy: OrlojPolicy):
        self.policy = policy
        self._requests: list[InferenceRequest | None] = []
        self._slot: dict[int, int] = {}  # request id -> slot
        self._free: list[int] = []
        self._deadline = np.zeros(0)
        self._app = np.zeros(0, np.int64)
        self._alive = np.zeros(0, bool)
        self._table = None
        self._base = 0.0
        self._post = 0.0

    def __len__(self) -> int:
        return len(self._slot)

    @property
    def requests(self) -> list[InferenceRequest]:
        """The pending requests, oldest slot first."""
        return [r for r in self._requests if r is not None]

    def add(self, requests: list[InferenceRequest]) -> None:
        """Queue arrivals (Alg. 4.1 inserts each into every ``Q_bs``; its line comes at the next decision)."""
        self._sync()
        if not requests:
            return
        while len(self._free) < len(requests):
            self._grow()
        slots = [self._free.pop() for _ in requests]
        codes = self._codes
        for r, slot in zip(requests, slots):
            self._slot[r.request_id] = slot
            self._requests[slot] = r
        at = np.array(slots)
        self._deadline[at] = [r.deadline_ms for r in requests]
        self._app[at] = [codes.get(r.app_id, 0) for r in requests] if codes else 0
        self._alive[at] = True
        self._in_q[:, at] = True
        self._milestone[:, at] = -np.inf  # no line yet
        self._estimate[:, at] = self._estimates[:, self._app[at]]

    def decide(self, now_ms: float, max_batch: int, post_ms: float = 0.0) -> tuple[list[InferenceRequest],
                                                                                    list[InferenceRequest]]:
        """One iteration of Algorithm 4.1: ``(batch to run, requests timed out)``, both removed from the queue."""
        self._sync()
        if post_ms != self._post:
            self._post = post_ms
            self._stale_all()
        sizes = self._sizes
        use = np.array([bs <= max_batch for bs in sizes]) if max_batch < sizes[-1] else np.ones(len(sizes), bool)
        if not use.any():
            use[0] = True
        live = np.flatnonzero(self._alive)
        if not len(live):
            return [], []
        deadline = self._deadline[live]
        viable = (self._estimate[:, live] <= (deadline - now_ms - post_ms)) & use[:, None]  # lines 10-12
        leaving = self._in_q[:, live] & ~viable
        for k in np.flatnonzero(leaving.any(1)):
            self._hull[k].remove_many(live[leaving[k]])
            self._milestone[k, live[leaving[k]]] = -np.inf  # should it come back (a larger max_batch): a new line
        self._in_q[:, live] = viable
        out = ~viable.any(0)  # lines 13-14
        dropped = self._release(live[out])
        counts = viable.sum(1)
        earliest = np.where(viable, deadline, np.inf).min(1)
        for k in sorted(range(len(sizes)), key=lambda k: (earliest[k], sizes[k]), reverse=True):  # lines 15-19
            if use[k] and counts[k] >= sizes[k]:
                break
        else:
            return [], dropped
        if self.policy.b * (now_ms - self._base) > RESET_EXPONENT:  # lines 2-4
            self._base = now_ms
            self._stale_all()
        members = live[viable[k]]
        due = members[self._milestone[k, members] <= now_ms]  # lines 5-9
        if len(due):
            alpha, beta, milestone = self._lines(k, due, now_ms)
            self._milestone[k, due] = milestone
            self._hull[k].insert_many(due, alpha, beta)
        chosen = self._hull[k].pop(float(np.exp(self.policy.b * (now_ms - self._base))), sizes[k])  # line 22
        return self._release(np.asarray(chosen, np.int64)), dropped

    # -- internals ------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Follow the policy's current tables (new histograms: new estimates, every line stale)."""
        table = self.policy.table
        if table is self._table:
            return
        self._table = table
        pol = self.policy
        self._sizes = list(table.batch_sizes)
        self._apps = sorted(table.histograms) if pol.mix in PER_APP else []
        self._codes = {a: i + 1 for i, a in enumerate(self._apps)}  # 0: the model-wide tables
        keys = [None, *self._apps]
        self._estimates = np.array([[table.means[table.key(a, bs)] for a in keys] for bs in self._sizes])
        self._tables = [[[_LineTable.build(table.latency[table.key(a, bs)], table.means[table.key(a, bs)], pol.b,
                                           offset, cost - prev)
                          for (offset, cost), prev in zip(pol.cost_steps, [0.0, *[c for _, c in pol.cost_steps]])]
                         for a in keys] for bs in self._sizes]
        cap = len(self._requests)
        self._hull = [LineQueue() for _ in self._sizes]
        self._in_q = np.zeros((len(self._sizes), cap), bool)
        self._milestone = np.full((len(self._sizes), cap), -np.inf)
        self._estimate = np.zeros((len(self._sizes), cap))
        known = {r.app_id for r in self._requests if r is not None}
        for a in known - set(self._codes):
            self._codes[a] = 0
        live = np.flatnonzero(self._alive)
        self._app[live] = [self._codes.get(self._requests[s].app_id, 0) for s in live]  # type: ignore[union-attr]
        self._estimate[:, live] = self._estimates[:, self._app[live]]
        self._in_q[:, live] = True

    def _stale_all(self) -> None:
        self._milestone[:] = -np.inf
        self._hull = [LineQueue() for _ in self._sizes]

    def _lines(self, k: int, slots: np.ndarray, now_ms: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Lines (summed over cost steps) and the next milestone (absolute ms) of ``slots`` for batch size ``k``."""
        alpha, beta, milestone = np.zeros(len(slots)), np.zeros(len(slots)), np.full(len(slots), np.inf)
        apps = self._app[slots]
        d_rel = self._deadline[slots] - self._post - self._base
        for code in np.unique(apps):
            mask = apps == code
            for line in self._tables[k][code]:
                a, c, m = line.lines(d_rel[mask], now_ms - self._base)
                alpha[mask] += a
                beta[mask] += c
                milestone[mask] = np.minimum(milestone[mask], m)
        return alpha, beta, milestone + self._base

    def _release(self, slots: np.ndarray) -> list[InferenceRequest]:
        """Remove ``slots`` from the queue (every ``Q_bs``) and hand their requests back."""
        if not len(slots):
            return []
        for hull in self._hull:
            if len(hull):
                hull.remove_many(slots)
        self._alive[slots] = False
        self._in_q[:, slots] = False
        out = []
        for s in slots.tolist():
            r = self._requests[s]
            self._requests[s] = None
            del self._slot[r.request_id]  # type: ignore[union-attr]
            self._free.append(s)
            out.append(r)
        return out  # type: ignore[return-value]

    def _grow(self) -> None:
        """Twice the slots (at least 64 more); the new ones are free."""
        cap = len(self._requests)
        grow = max(64, cap)
        self._requests.extend([None] * grow)
        self._deadline = np.concatenate([self._deadline, np.zeros(grow)])
        self._app = np.concatenate([self._app, np.zeros(grow, np.int64)])
        self._alive = np.concatenate([self._alive, np.zeros(grow, bool)])
        k = len(self._sizes)
        self._in_q = np.concatenate([self._in_q, np.zeros((k, grow), bool)], 1)
        self._milestone = np.concatenate([self._milestone, np.full((k, grow), -np.inf)], 1)
        self._estimate = np.concatenate([self._estimate, np.zeros((k, grow))], 1)
        self._free.extend(range(cap + grow - 1, cap - 1, -1))
