"""ORLOJ's priority queue as a dynamic upper envelope of lines (Yu 2022, §4.4.4, Fig. 4.12).

Between milestones a request's Eq. 4.2 score is ``α·x + β`` with ``x = e^{b·t}`` (``policy.line_coefficients``,
``queue.OrlojQueue``), so the highest-scored request at time ``t`` is the line on top of the upper envelope at
``x`` — the thesis's "first point on the convex hull hit by affine lines of slope −e^{bt}" in the dual. The thesis
keeps the hull with Overmars and van Leeuwen's structure (O(log² n) per update). We use Bentley and Saxe's
logarithmic method instead, which has the same O(log² n) query bound with amortised O(log n) insertion: blocks of
up to 2^i lines, each a static envelope, merged like a binary counter. A line is named by a small integer id (the
caller's slot); moving it at a milestone or removing it leaves a tombstone, found by a version per id.

What Python changes: a loop over lines costs about a microsecond per line, so a block's envelope is built by Qhull
(``scipy.spatial.ConvexHull``: the envelope is the upper hull of the points ``(α, β)``) once it has 32 lines, lines
come in bulk (``insert_many``: the requests whose milestone passed since the last decision, one block), and a
block with tombstones answers a query by one vectorised argmax over its live lines instead of being rebuilt (it
is rebuilt once more than half of it is dead, so each line is rebuilt O(1) times amortised).

Example: lines {0: (1, 0), 1: (0, 5)} → ``top(2.0)`` = ``1`` (5 > 2), ``top(10.0)`` = ``0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import ConvexHull, QhullError

QHULL_FROM = 32  # lines in a block from which Qhull builds its envelope (below: the loop is cheaper)


@dataclass
class _Block:
    """A static upper envelope: its lines (slope order, with the version each was inserted at), the envelope's
    lines and the x from which each takes over, and how many of its lines have died since it was built."""

    ids: np.ndarray
    versions: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    hull: np.ndarray  # indices of the envelope's lines, by increasing slope
    start: np.ndarray  # x at which each envelope line takes over
    dead: int = 0

    @classmethod
    def build(cls, ids: np.ndarray, versions: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> "_Block":
        order = np.lexsort((beta, alpha))
        ids, versions, alpha, beta = ids[order], versions[order], alpha[order], beta[order]
        if len(ids) >= QHULL_FROM:
            envelope = _upper_hull(alpha, beta)
            if envelope is not None:
                return cls(ids, versions, alpha, beta, *envelope)
        a, b = alpha.tolist(), beta.tolist()
        hull: list[int] = []
        start: list[float] = []
        for i in range(len(a)):
            if hull and a[hull[-1]] == a[i]:  # same slope: the higher one (sorted last) wins
                hull.pop()
                start.pop()
            while hull:
                j = hull[-1]
                x = (b[j] - b[i]) / (a[i] - a[j])  # where line i overtakes line j
                if x <= start[-1]:
                    hull.pop()
                    start.pop()
                else:
                    break
            start.append(-np.inf if not hull else (b[hull[-1]] - b[i]) / (a[i] - a[hull[-1]]))
            hull.append(i)
        return cls(ids, versions, alpha, beta, np.array(hull, int), np.array(start))

    def __len__(self) -> int:
        return len(self.ids)


def _upper_hull(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The envelope of lines sorted by ``(α, β)`` as ``(hull, start)`` from Qhull's counter-clockwise hull of the
    points ``(α, β)``: its part from the rightmost point back to the leftmost-highest, reversed. None when Qhull
    refuses the points (fewer than three distinct, or all on one line) or rounding left the crossings unsorted:
    the loop builds it then."""
    try:
        ccw = ConvexHull(np.column_stack([alpha, beta]), qhull_options="QbB").vertices
    except (QhullError, ValueError):
        return None
    left = int(np.searchsorted(alpha, alpha[0], side="right")) - 1  # the highest of the smallest slope
    ring = ccw.tolist()
    if left not in ring or len(alpha) - 1 not in ring:
        return None
    i, j = ring.index(len(alpha) - 1), ring.index(left)
    upper = (ring[i:j + 1] if i <= j else ring[i:] + ring[:j + 1])[::-1]
    hull = np.array(upper, int)
    start = np.concatenate([[-np.inf], (beta[hull[:-1]] - beta[hull[1:]]) / (alpha[hull[1:]] - alpha[hull[:-1]])])
    if not (np.all(np.diff(alpha[hull]) > 0) and np.all(np.diff(start) > 0)):
        return None
    return hull, start


class LineQueue:
    """Lines ``α·x + β`` by integer id: insert (or move, at a milestone), remove, and the highest at ``x``."""

    def __init__(self) -> None:
        self._blocks: list[_Block | None] = []
        self._version = np.zeros(64, np.int64)  # per id: the version of its current line
        self._level = np.full(64, -1, np.int64)  # per id: the block holding its current line (-1: none)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def insert(self, rid: int, alpha: float, beta: float) -> None:
        """Add a request's line, replacing its old one (Alg. 4.1 line 9 at a milestone)."""
        self.insert_many(np.array([rid]), np.array([alpha], float), np.array([beta], float))

    def insert_many(self, ids: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> None:
        """Add (or move) the lines of distinct ``ids`` as one block, merged like a binary counter."""
        ids = np.asarray(ids, np.int64)
        if not len(ids):
            return
        self._grow(int(ids.max()) + 1)
        self._kill(ids)
        self._version[ids] += 1
        self._count += len(ids)
        block = _Block.build(ids, self._version[ids], np.asarray(alpha, float), np.asarray(beta, float))
        level = max(0, int(len(block) - 1).bit_length())
        while level < len(self._blocks) and self._blocks[level] is not None:
            other = self._blocks[level]
            self._blocks[level] = None
            live = self._live(other)
            merged = (np.concatenate([block.ids, other.ids[live]]), np.concatenate([block.versions, other.versions[live]]),
                      np.concatenate([block.alpha, other.alpha[live]]), np.concatenate([block.beta, other.beta[live]]))
            block = _Block.build(*merged)
            level = max(level + 1, int(len(block) - 1).bit_length())
        self._place(block, level)

    def remove(self, rid: int) -> None:
        """Drop a request (its line stays in its block as a tombstone)."""
        if 0 <= rid < len(self._level):
            self._kill_one(rid)

    def remove_many(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, np.int64)
        ids = ids[ids < len(self._level)]
        self._kill(ids)

    def top(self, x: float) -> int | None:
        """The id whose line is highest at ``x`` (None when empty)."""
        best = max((self._block_top(level, x) for level in range(len(self._blocks))), default=(-np.inf, -1))
        return None if best[1] < 0 else best[1]

    def pop(self, x: float, k: int) -> list[int]:
        """The ``k`` highest lines at ``x`` (fewer when the queue holds fewer), removed (Alg. 4.1's PopBatch):
        every block's top once, then after each pick only the picked line's block again."""
        tops = [self._block_top(level, x) for level in range(len(self._blocks))]
        out: list[int] = []
        while len(out) < k and tops:
            best = max(tops)
            if best[1] < 0:
                break
            level = tops.index(best)
            out.append(best[1])
            self._kill_one(best[1])
            tops[level] = self._block_top(level, x)
        return out

    def _block_top(self, level: int, x: float) -> tuple[float, int]:
        """``(value, id)`` of block ``level``'s highest live line at ``x`` (``(-inf, -1)`` when it has none): the
        envelope when it has no tombstone, else one vectorised argmax; a block more than half dead is rebuilt."""
        blk = self._blocks[level]
        if blk is None:
            return -np.inf, -1
        if blk.dead:
            live = self._live(blk)
            if 2 * blk.dead <= len(blk):
                values = np.where(live, blk.alpha * x + blk.beta, -np.inf)
                i = int(values.argmax())
                return (float(values[i]), int(blk.ids[i])) if live[i] else (-np.inf, -1)
            self._blocks[level] = None
            if not live.any():
                return -np.inf, -1
            blk = _Block.build(blk.ids[live], blk.versions[live], blk.alpha[live], blk.beta[live])
            self._place(blk, level)
        i = int(blk.hull[np.searchsorted(blk.start, x, side="right") - 1])
        return float(blk.alpha[i] * x + blk.beta[i]), int(blk.ids[i])

    def _live(self, blk: _Block) -> np.ndarray:
        return (self._level[blk.ids] >= 0) & (self._version[blk.ids] == blk.versions)

    def _place(self, blk: _Block, level: int) -> None:
        while len(self._blocks) <= level:
            self._blocks.append(None)
        self._blocks[level] = blk
        self._level[blk.ids[self._version[blk.ids] == blk.versions]] = level

    def _kill_one(self, rid: int) -> None:
        level = int(self._level[rid])
        if level >= 0:
            self._blocks[level].dead += 1  # type: ignore[union-attr]
            self._level[rid] = -1
            self._count -= 1

    def _kill(self, ids: np.ndarray) -> None:
        """Tombstone the current lines of ``ids`` (those that have one)."""
        levels = self._level[ids]
        has = levels >= 0
        if not has.any():
            return
        for level, n in enumerate(np.bincount(levels[has]).tolist()):
            if n:
                self._blocks[level].dead += n  # type: ignore[union-attr]
        self._level[ids[has]] = -1
        self._count -= int(has.sum())

    def _grow(self, n: int) -> None:
        if n > len(self._version):
            size = max(n, 2 * len(self._version))
            self._version = np.concatenate([self._version, np.zeros(size - len(self._version), np.int64)])
            self._level = np.concatenate([self._level, np.full(size - len(self._level), -1, np.int64)])
