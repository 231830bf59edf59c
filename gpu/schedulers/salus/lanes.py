"""Salus GPU lanes: where a job's ephemeral memory goes (thesis Ch. 2 = Salus, MLSys'20, §2.3.3).

P. Yu, *Application-Aware Scheduling in Deep Learning Software Stacks*, PhD thesis, U. Michigan, 2022.

Device memory is split like a stack and a heap (Fig. 2.6a): every admitted job's *persistent* memory ``P``
(model + framework-internal) sits in the persistent region growing up from address 0; the *ephemeral*
region grows down from the top and is cut into **lanes**. A lane holds the scratch memory of one iteration
at a time, so jobs sharing a lane are time-shared and lanes run in parallel. ``LaneManager`` keeps the
safety condition (Eq. 2.1)

    sum_i P_i + sum_lanes max_{j in lane} E_j <= C

as a checked invariant, finds a lane for each arriving job with Algorithm 2.1 and lays lanes out
contiguously, moving them only at iteration boundaries (auto-defragmentation, §2.3.3.1, Fig. 2.6b).

Choices where the thesis is silent (our reading, see ``docs/salus.md``):

* "best match" (Alg. 2.1 line 5) = the smallest lane with ``L_j >= E``, ties to the lane with fewest jobs;
* joining a lane still adds ``P`` to the persistent region, so lines 4–6 re-check ``sum P + P + sum L <= C``;
* a grow (line 9) only ever grows a lane and is *applied* when the lane reaches an iteration boundary:
  until then the lane cannot start an iteration (``ready``) — the memory below it is still in use;
* on departure the lane shrinks to ``max E`` of its remaining jobs, an empty lane is dropped;
* margins from the authors' code: ``P`` x 1.1, ``P + E`` x 1.05, 300 MB of the device held in reserve;
* a lane whose token holder overran its bound is *fenced* (``fence``, ``split_off``, ``unfence``): kept at its size
  for that job's iteration in flight, closed to new jobs, its other jobs moved to a lane of their own
  (``gpu.schedulers.salus.overrun``).

Units: MB throughout. Lane ids are small integers, never reused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpu.errors import ConfigError, GpuflowsError, NeverFitsError
from gpu.scenario import MAX_MB

_TOL = 1e-6
OUTCOMES = ("new", "join", "grow", "not_found")
"""Algorithm 2.1's four outcomes, in its order of preference."""


class SafetyViolation(GpuflowsError, AssertionError):
    """Eq. 2.1 (or the lane layout it implies) does not hold: admitting would let a job run out of memory."""


@dataclass(frozen=True)
class Margins:
    """Safety margins on declared sizes (authors' code): charged ``P' = P*persistent*total``, ``E' = E*total``.

    Example: ``Margins().charge(1000, 4000) == (1155.0, 4200.0)`` on a device of ``C - 300`` usable MB.
    """

    persistent: float = 1.1
    total: float = 1.05
    reserve_mb: float = 300.0

    def __post_init__(self) -> None:
        for name in ("persistent", "total"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 1 <= v <= 100:
                raise ConfigError(f"margins.{name}", v, "must be a finite factor from 1 to 100")
        r = self.reserve_mb
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or not 0 <= r <= MAX_MB:
            raise ConfigError("margins.reserve_mb", r, f"must be a finite number of MB from 0 to {MAX_MB:,.0f} (1 TiB)")

    def charge(self, persistent_mb: float, ephemeral_mb: float) -> tuple[float, float]:
        return persistent_mb * self.persistent * self.total, ephemeral_mb * self.total


NO_MARGINS = Margins(1.0, 1.0, 0.0)
"""Exact accounting, as Algorithm 2.1 is written (the thesis's worked examples use it)."""


@dataclass(frozen=True)
class LaneChoice:
    """Algorithm 2.1's answer: ``outcome`` in ``OUTCOMES``, the lane (None when not found) and its new size.

    Example: ``LaneChoice("grow", 2, 6000.0)`` — lane 2 grows to 6000 MB at its next iteration boundary.
    """

    outcome: str
    lane_id: int | None = None
    size_mb: float = 0.0


@dataclass(frozen=True)
class LaneView:
    """A lane as the world sees it: target size/offset, where it physically is now, and its jobs (join order)."""

    lane_id: int
    size_mb: float
    offset_mb: float
    placed_size_mb: float | None
    placed_offset_mb: float | None
    jobs: tuple[str, ...]

    @property
    def settled(self) -> bool:
        return (self.placed_offset_mb is not None and abs(self.placed_offset_mb - self.offset_mb) < _TOL
                and abs((self.placed_size_mb or 0.0) - self.size_mb) < _TOL)


@dataclass(frozen=True)
class LaneMove:
    """A lane laid out anew at an iteration boundary (opened, grown, shrunk or moved up into freed space)."""

    lane_id: int
    offset_mb: float
    size_mb: float


@dataclass
class _Lane:
    jobs: list[str] = field(default_factory=list)
    placed: tuple[float, float] | None = None  # (offset, size) where its memory is now; None = not yet opened


class LaneManager:
    """Algorithm 2.1 + Eq. 2.1 + auto-defragmentation for one device.

    Args:
        capacity_mb: the device's memory ``C``.
        margins: charged sizes and reserve (default: the authors' margins; ``NO_MARGINS`` for exact sums).
        max_lanes: cap on the number of lanes (1 = one shared lane, as the SRTF/FAIR experiments use, §2.5.1.2).
        max_jobs: cap on admitted jobs (1 = exclusive FIFO, the baseline of Table 2.1).
    """

    def __init__(self, capacity_mb: float, margins: Margins = Margins(), max_lanes: int | None = None,
                 max_jobs: int | None = None):
        if not isinstance(capacity_mb, (int, float)) or not math.isfinite(capacity_mb) or capacity_mb <= 0:
            raise ConfigError("capacity_mb", capacity_mb, "must be a finite number of MB > 0")
        if capacity_mb <= margins.reserve_mb:
            raise ConfigError("capacity_mb", capacity_mb, f"must exceed the {margins.reserve_mb} MB reserve")
        for name, cap in (("max_lanes", max_lanes), ("max_jobs", max_jobs)):
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
                raise ConfigError(name, cap, "must be a whole number >= 1 (or None for no cap)")
        self.capacity_mb = float(capacity_mb)
        self.margins = margins
        self.usable_mb = self.capacity_mb - margins.reserve_mb
        self.max_lanes, self.max_jobs = max_lanes, max_jobs
        self.persistent: dict[str, float] = {}
        self.ephemeral: dict[str, float] = {}
        self.lane_of: dict[str, int] = {}
        self._lanes: dict[int, _Lane] = {}  # insertion order = layout order, top of memory first
        self._fences: dict[int, tuple[str, float]] = {}  # lane -> (job past its token bound, lane size kept)
        self._next_id = 0

    # --- Eq. 2.1 ------------------------------------------------------------------------------------------
    def lane_size(self, lane_id: int) -> float:
        """``L_l = max_{j in l} E_j`` (a grow adds the job whose ``E`` sets the new size, Alg. 2.1 line 9); a fenced
        lane keeps the size it had when fenced (its holder's iteration may still use any of it)."""
        if lane_id in self._fences:
            return self._fences[lane_id][1]
        return max((self.ephemeral[j] for j in self._lanes[lane_id].jobs), default=0.0)

    def used_mb(self) -> float:
        """Left-hand side of Eq. 2.1 over charged sizes."""
        return sum(self.persistent.values()) + sum(self.lane_size(lid) for lid in self._lanes)

    def check(self) -> None:
        """Raise ``SafetyViolation`` unless Eq. 2.1 holds and placed lanes are disjoint and inside the region."""
        if self.used_mb() > self.usable_mb + _TOL:
            raise SafetyViolation(f"Eq. 2.1 broken: {self.used_mb():.1f} MB > {self.usable_mb:.1f} MB usable")
        spans = sorted(lane.placed for lane in self._lanes.values() if lane.placed is not None)
        for (a, sa), (b, _) in zip(spans, spans[1:]):
            if a + sa > b + _TOL:
                raise SafetyViolation(f"lanes overlap at {b:.1f} MB")
        if spans and (spans[0][0] < -_TOL or spans[-1][0] + spans[-1][1] > self.usable_mb + _TOL):
            raise SafetyViolation("a lane lies outside the ephemeral region")

    # --- Algorithm 2.1 --------------------------------------------------------------------------------------
    def charge(self, job_id: str, persistent_mb: float, ephemeral_mb: float) -> tuple[float, float]:
        """Check a job's declared sizes and return its charged ``(P, E)``; bad sizes fail before any work."""
        for name, v in (("persistent_mb", persistent_mb), ("ephemeral_mb", ephemeral_mb)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"jobs[{job_id}].{name}", v, "must be a finite number of MB > 0")
        p, e = self.margins.charge(persistent_mb, ephemeral_mb)
        if p + e > self.usable_mb + _TOL:
            raise NeverFitsError(f"job {job_id}: P + E = {p + e:.1f} MB (with margins) can never fit a device of "
                                 f"{self.capacity_mb:.0f} MB ({self.usable_mb:.0f} MB usable)")
        return p, e

    def find(self, p: float, e: float) -> LaneChoice:
        """Algorithm 2.1 for charged sizes ``(p, e)`` against the current lanes; changes nothing."""
        if self.max_jobs is not None and len(self.persistent) >= self.max_jobs:
            return LaneChoice("not_found")
        sum_p = sum(self.persistent.values()) + p
        sum_l = sum(self.lane_size(lid) for lid in self._lanes)
        sizes = {lid: self.lane_size(lid) for lid in self._lanes if lid not in self._fences}  # a fence takes no job
        if (self.max_lanes is None or len(sizes) < self.max_lanes) and sum_p + sum_l + e <= self.usable_mb + _TOL:
            return LaneChoice("new", None, e)                                          # lines 1-3
        fits = [lid for lid, size in sizes.items() if size >= e - _TOL]
        if fits and sum_p + sum_l <= self.usable_mb + _TOL:                              # lines 4-6 + re-check
            best = min(fits, key=lambda lid: (sizes[lid], len(self._lanes[lid].jobs)))
            return LaneChoice("join", best, sizes[best])
        for lid in sorted(sizes, key=lambda lid: sizes[lid]):                            # lines 7-10
            if sizes[lid] < e and sum_p + sum_l - sizes[lid] + e <= self.usable_mb + _TOL:
                return LaneChoice("grow", lid, e)
        return LaneChoice("not_found")                                                   # line 11

    def admit(self, job_id: str, p: float, e: float) -> LaneChoice:
        """Run Algorithm 2.1 for a job and, unless "not found", give it the lane; Eq. 2.1 is re-checked."""
        if job_id in self.persistent:
            raise ConfigError("job_id", job_id, "already admitted on this device")
        choice = self.find(p, e)
        if choice.outcome == "not_found":
            return choice
        if choice.outcome == "new":
            lane_id, self._next_id = self._next_id, self._next_id + 1
            self._lanes[lane_id] = _Lane()
            choice = LaneChoice("new", lane_id, e)
        self._lanes[choice.lane_id].jobs.append(job_id)
        self.persistent[job_id], self.ephemeral[job_id] = p, e
        self.lane_of[job_id] = choice.lane_id
        self.check()
        return choice

    def release(self, job_id: str) -> int:
        """A job left: free its persistent memory; its lane shrinks to the rest's ``max E`` or is dropped.

        Returns the lane it was in. The layout catches up at the lanes' next boundaries (``settle``).
        """
        lane_id = self.lane_of.pop(job_id)
        del self.persistent[job_id], self.ephemeral[job_id]
        lane = self._lanes[lane_id]
        lane.jobs.remove(job_id)
        if self._fences.get(lane_id, ("",))[0] == job_id:
            del self._fences[lane_id]
        if not lane.jobs:
            del self._lanes[lane_id]
        self.check()
        return lane_id

    # --- a token holder past its bound (gpu.schedulers.salus.overrun) ------------------------------------------
    def fence(self, job_id: str) -> None:
        """The job holding its lane's token lost it mid-iteration: its lane keeps its size and takes no new job
        until the job reaches its boundary (``unfence``) or leaves (``release``)."""
        lane_id = self.lane_of[job_id]
        self._fences[lane_id] = (job_id, self.lane_size(lane_id))

    def split_off(self, job_id: str) -> int | None:
        """Move the other jobs of ``job_id``'s fenced lane to a new lane sized to their ``max E`` (laid out at the
        next ``settle``), so they go on while the fence keeps the job's memory. Returns the new lane, or None when
        the job is alone or Eq. 2.1 has no room for the new lane yet (they wait; call again later)."""
        lane_id = self.lane_of[job_id]
        rest = [j for j in self._lanes[lane_id].jobs if j != job_id]
        if not rest or lane_id not in self._fences:
            return None
        size = max(self.ephemeral[j] for j in rest)
        if self.used_mb() + size > self.usable_mb + _TOL:
            return None
        new_id, self._next_id = self._next_id, self._next_id + 1
        self._lanes[new_id] = _Lane(rest)
        self._lanes[lane_id].jobs = [job_id]
        for j in rest:
            self.lane_of[j] = new_id
        self.check()
        return new_id

    def unfence(self, job_id: str) -> None:
        """The fenced lane's job reached its boundary: the lane is an ordinary lane again."""
        self._fences.pop(self.lane_of[job_id], None)

    @property
    def fenced(self) -> dict[int, str]:
        """Fenced lanes and the job each is kept for."""
        return {lid: job for lid, (job, _) in self._fences.items()}

    # --- layout and auto-defragmentation --------------------------------------------------------------------
    def targets(self) -> dict[int, tuple[float, float]]:
        """Compacted layout: lanes stacked down from the top of usable memory in creation order."""
        out, top = {}, self.usable_mb
        for lid in self._lanes:
            size = self.lane_size(lid)
            top -= size
            out[lid] = (top, size)
        return out

    def settle(self, idle: set[int]) -> tuple[LaneMove, ...]:
        """Move/resize every idle lane whose target span is free (Fig. 2.6b: a lane slides up into the space
        of a departed one at its iteration boundary). ``idle``: lanes with no iteration in flight."""
        moves: list[LaneMove] = []
        targets = self.targets()
        changed = True
        while changed:
            changed = False
            for lid, (off, size) in targets.items():
                lane = self._lanes[lid]
                if lid not in idle or lane.placed == (off, size):
                    continue
                others = [l.placed for k, l in self._lanes.items() if k != lid and l.placed is not None]
                if all(off + size <= o + _TOL or o + s <= off + _TOL for o, s in others):
                    lane.placed = (off, size)
                    moves.append(LaneMove(lid, off, size))
                    changed = True
        self.check()
        return tuple(moves)

    def ready(self, lane_id: int) -> bool:
        """A lane may start an iteration: laid out at its target, and clear of the persistent region.

        Judged for this lane alone: another lane still waiting to slide (its iteration in flight) holds only its
        own span, so lanes already in place go on running meanwhile — lanes run in parallel and
        defragmentation costs them nothing (§2.3.3, §2.3.3.1)."""
        off, size = self.targets()[lane_id]
        placed = self._lanes[lane_id].placed
        floor = sum(self.persistent.values())
        return placed is not None and abs(placed[0] - off) < _TOL and abs(placed[1] - size) < _TOL \
            and placed[0] >= floor - _TOL

    def jobs_in(self, lane_id: int) -> tuple[str, ...]:
        """The lane's jobs in joining order."""
        return tuple(self._lanes[lane_id].jobs)

    def lanes(self) -> tuple[LaneView, ...]:
        targets = self.targets()
        return tuple(LaneView(lid, targets[lid][1], targets[lid][0],
                              lane.placed[1] if lane.placed else None, lane.placed[0] if lane.placed else None,
                              tuple(lane.jobs)) for lid, lane in self._lanes.items())
