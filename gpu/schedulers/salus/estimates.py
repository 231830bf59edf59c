"""How much GPU time a Salus job still needs: its measured iteration time x the iterations it has left (§2.4.2).

The thesis's SRTF "assume[s] the job execution time is known"; the authors' code ranks a lane's jobs by the
declared total minus the GPU time used so far (``totalRunningTime - usedRunningTime``). A declaration is a guess:
a job heavier than it declared reaches zero remaining time after its declared share and can never be pre-empted
again, and two jobs that declared the same total keep their arrival order however differently they run. So the
controller measures instead. Every iteration boundary reports the GPU seconds the iteration took
(``SalusController.on_iteration``, the torch executor times it after a synchronise); ``IterationClock`` keeps an
exponentially weighted moving average of them, started at the first measured iteration and updated at every
later one, and a job's remaining time is that average x the iterations it has left. The declared total is only
the prior: it ranks a job until its first iteration is measured, and wherever the job never said how many
iterations it runs (then remaining = declared - used, as in the authors' code).

FAIR needs no estimate: its service is the GPU time each job was measured to use (§2.4.3).
"""

from __future__ import annotations

from dataclasses import dataclass

EWMA_WEIGHT = 0.3
"""How far one measured iteration moves the estimate: an outlier (a first iteration building lazy state, a load
spike on a shared machine) shifts it by under a third, and a lasting change is followed within about five
iterations (0.7^5 = 0.17 of the old estimate left)."""


@dataclass
class IterationClock:
    """A job's measured seconds per iteration and the iterations it has left.

    ``left``: iterations still to run (None: unknown, the job has not said); ``per_iteration_s``: the moving average
    of its measured iterations (None: none measured yet); ``measured``: how many iterations it averages.
    Example: ``c = IterationClock(left=10); c.observe(2.0); c.remaining_s(prior_s=5.0, used_s=2.0) == 18.0``.
    """

    left: int | None = None
    per_iteration_s: float | None = None
    measured: int = 0

    def observe(self, seconds: float, iterations: int = 1, measured: bool = True) -> None:
        """``iterations`` iterations ended after ``seconds`` of GPU time in all. ``measured=False``: they count
        against the iterations left but not as a measurement (an iteration that held its token past its bound:
        its time is the stop, not the work)."""
        if self.left is not None:
            self.left = max(0, self.left - iterations)
        if not measured or iterations < 1:
            return
        per = seconds / iterations
        self.per_iteration_s = per if self.per_iteration_s is None else \
            EWMA_WEIGHT * per + (1 - EWMA_WEIGHT) * self.per_iteration_s
        self.measured += iterations

    def remaining_s(self, prior_s: float | None, used_s: float) -> float:
        """Measured seconds per iteration x iterations left; before the first measurement, or when the job never
        said how many iterations it runs, the prior: ``prior_s`` (its declared total) - ``used_s`` (at least 0)."""
        if self.left is not None and self.per_iteration_s is not None:
            return self.per_iteration_s * self.left
        return max(0.0, (prior_s or 0.0) - used_s)
