"""ORLOJ's priority queue as a dynamic upper envelope of lines (Yu 2022, §4.4.4, Fig. 4.12).

Between milestones a request's Eq. 4.2 score is ``α·x + β`` with ``x = e^{b·t}`` (``orloj.line_coefficients``),
so the highest-scored request at time ``t`` is the line on top of the upper envelope at ``x`` — the thesis's
"first point on the convex hull hit by affine lines of slope −e^{bt}" in the dual. The thesis keeps the hull
with Overmars and van Leeuwen's structure (O(log² n) per update). We use Bentley and Saxe's logarithmic method
instead, which is simpler and has the same O(log² n) query bound, with amortised O(log n) insertion: blocks of
2^i lines, each a static envelope merged like a binary counter; a deletion is a tombstone, and a block is
rebuilt without its dead lines when a query lands on one.

Example: lines {a: (1, 0), b: (0, 5)} → ``top(2.0)`` = ``"b"`` (5 > 2), ``top(10.0)`` = ``"a"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import numpy as np


@dataclass
class _Block:
    """A static upper envelope: its lines (slope order) and the x from which each envelope line is on top."""

    ids: list
    alpha: np.ndarray
    beta: np.ndarray
    hull: np.ndarray  # indices of the envelope's lines, by increasing slope
    start: np.ndarray  # x at which each envelope line takes over

    @classmethod
    def build(cls, ids: list, alpha: np.ndarray, beta: np.ndarray) -> "_Block":
        order = np.lexsort((beta, alpha))
        ids = [ids[i] for i in order]
        alpha, beta = alpha[order], beta[order]
        hull: list[int] = []
        start: list[float] = []
        for i in range(len(ids)):
            if hull and alpha[hull[-1]] == alpha[i]:  # same slope: the higher one (sorted last) wins
                hull.pop()
                start.pop()
            while hull:
                j = hull[-1]
                x = (beta[j] - beta[i]) / (alpha[i] - alpha[j])  # where line i overtakes line j
                if x <= start[-1]:
                    hull.pop()
                    start.pop()
                else:
                    break
            start.append(-np.inf if not hull else (beta[hull[-1]] - beta[i]) / (alpha[i] - alpha[hull[-1]]))
            hull.append(i)
        return cls(ids, alpha, beta, np.array(hull, int), np.array(start))

    def top(self, x: float) -> int:
        """Index (into ``ids``) of the highest line at ``x``."""
        return int(self.hull[np.searchsorted(self.start, x, side="right") - 1])


class LineQueue:
    """Requests as lines ``α·x + β``: insert (or move, at a milestone), remove, and the highest at ``x``."""

    def __init__(self) -> None:
        self._blocks: list[_Block | None] = []
        self._token: dict[Hashable, int] = {}  # request -> the token of its current line
        self._owner: dict[int, Hashable] = {}  # live token -> request
        self._next = 0

    def __len__(self) -> int:
        return len(self._token)

    def insert(self, rid: Hashable, alpha: float, beta: float) -> None:
        """Add a request's line, replacing its old one (Alg. 4.1 line 9 at a milestone)."""
        self.remove(rid)
        token, self._next = self._next, self._next + 1
        self._token[rid], self._owner[token] = token, rid
        ids, a, b = [token], [alpha], [beta]
        level = 0
        while level < len(self._blocks) and self._blocks[level] is not None:
            blk = self._blocks[level]
            keep = [k for k, t in enumerate(blk.ids) if t in self._owner]  # dead lines go at the merge
            ids += [blk.ids[k] for k in keep]
            a += blk.alpha[keep].tolist()
            b += blk.beta[keep].tolist()
            self._blocks[level] = None
            level += 1
        if level == len(self._blocks):
            self._blocks.append(None)
        self._blocks[level] = _Block.build(ids, np.array(a, float), np.array(b, float))

    def remove(self, rid: Hashable) -> None:
        """Drop a request (lazily: its line stays in its block until a merge or a rebuild)."""
        token = self._token.pop(rid, None)
        if token is not None:
            del self._owner[token]

    def top(self, x: float) -> Hashable | None:
        """The request whose line is highest at ``x`` (None when empty)."""
        best, best_val = None, -np.inf
        for level, blk in enumerate(self._blocks):
            if blk is None:
                continue
            i = blk.top(x)
            if blk.ids[i] not in self._owner:  # a dead line on top: rebuild the block without its dead lines
                keep = [k for k, t in enumerate(blk.ids) if t in self._owner]
                blk = _Block.build([blk.ids[k] for k in keep], blk.alpha[keep], blk.beta[keep]) if keep else None
                self._blocks[level] = blk
                if blk is None:
                    continue
                i = blk.top(x)
            value = blk.alpha[i] * x + blk.beta[i]
            if value > best_val:
                best, best_val = self._owner[blk.ids[i]], value
        return best
