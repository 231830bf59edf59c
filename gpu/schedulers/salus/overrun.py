"""How long a Salus job may hold its lane's iteration token, and what happens to a job that holds it longer.

Salus switches jobs only at iteration boundaries (thesis Ch. 2, §2.3.2): the job running an iteration in a lane
holds the lane until the iteration ends, because its ephemeral memory is in the lane (§2.3.3). A job that never
reaches its boundary — its process stopped (SIGSTOP, a debugger, a frozen cgroup), hung, or swapped out — would
keep the lane, and every job time-sharing it, waiting for ever. So a holder has a bound: ``max(floor_s,
factor x the longest iteration it measured so far)``; past it the holder *loses the token*.

Losing the token does not give its memory away. The job may still run a kernel of the iteration in flight (a
stopped process resumes where it stopped, and a GPU runs the kernels already queued), so its lane becomes a
*fence*: kept at its size, held by this job alone, closed to new jobs; the lane's other jobs go on in a new lane
of their own as soon as Eq. 2.1 has room for it (``LaneManager.split_off``), and the other lanes never wait.
If the job resumes, it finishes its iteration, gives its ephemeral memory back at the boundary as every job
does, and is re-admitted (Algorithm 2.1, before any queued job: its persistent memory is resident) to wait for
the token again, as any job between iterations does. Until that boundary, or until the job is gone, its
memory stays charged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpu.errors import ConfigError


@dataclass(frozen=True)
class TokenBound:
    """A token holder's bound: ``max(floor_s, factor x its longest measured iteration)`` seconds.

    ``floor_s`` covers a job's first iteration (nothing measured yet: CUDA context, lazy state, autotuning) and
    the hand-off itself on a loaded machine; a job may declare its own floor (``SalusJob.token_floor_s``).
    Example: ``TokenBound(60, 10).limit_s(8.0) == 80.0``; ``TokenBound(60, 10).limit_s(0.2) == 60.0``.
    """

    floor_s: float = 60.0
    factor: float = 10.0

    def __post_init__(self) -> None:
        check_floor(self.floor_s, "token_bound.floor_s")
        f = self.factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 1 <= f <= 1e6:
            raise ConfigError("token_bound.factor", f, "must be a finite factor between 1 and 1e6")

    def limit_s(self, longest_s: float, floor_s: float | None = None) -> float:
        """The bound of a holder whose longest measured iteration took ``longest_s`` (its own floor if declared)."""
        return max(self.floor_s if floor_s is None else floor_s, self.factor * longest_s)


MAX_FLOOR_S = 7 * 24 * 3600.0
"""A week: a floor beyond it is a typo, not an iteration."""


def check_floor(value: float, field: str) -> float:
    """A token floor in seconds: finite, > 0 and at most ``MAX_FLOOR_S``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_FLOOR_S:
        raise ConfigError(field, value, f"must be a number of seconds > 0 and <= {MAX_FLOOR_S:g} (a week)")
    return float(value)


@dataclass(frozen=True)
class Holding:
    """Who holds a lane's token: since how long, its bound, and whether it has lost the token (``revoked``)."""

    lane_id: int
    job_id: str
    held_s: float
    bound_s: float
    revoked: bool


@dataclass(frozen=True)
class Revoked:
    """A holder past its bound lost its lane's token (module docstring): its lane is fenced until it reaches its
    boundary or leaves."""

    job_id: str
    lane_id: int
    held_s: float
    bound_s: float
