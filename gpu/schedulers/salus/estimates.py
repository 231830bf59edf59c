"""How much GPU time a Salus job still needs: its measured iteration time x the iterations it has left (§2.4.2).

The thesis's SRTF "assume[s] the job execution time is known"; the authors' code ranks a lane's jobs by the
declared total minus the GPU time used so far (``totalRunningTime - usedRunningTime``). A declaration is a guess:
a job heavier than it declared reaches zero remaining time after its declared share and can never be pre-empted
again, and two jobs that declared the same total keep their arrival order however differently they run. So the
controller measures instead. Every iteration boundary reports the GPU seconds the iteration took
(``SalusController.on_iteration``; the torch executor times it after a synchronise), and a job's remaining time is
its seconds per iteration x the iterations it has left (the simulator knows them; a torch job's loop says how many
it runs when it first asks for the token). Its seconds per iteration are an exponentially weighted moving average
that *starts at the prior* — the declared total / the iterations — and moves ``EWMA_WEIGHT`` of the way to each
steady iteration measured (``WARMUP_ITERATIONS`` are not averaged). So the declaration ranks a job only until it
has run, one odd iteration (a load spike while another job sets up beside it) cannot make a job look ten times
longer at once and then starve behind a stale estimate, and a job that really is ten times heavier than declared
passes its rivals within a few iterations (0.7^k of the prior is left after k). A job that never says how many
iterations it runs is ranked as in the authors' code: declared - used.

FAIR needs no estimate: its service is the GPU time each job was measured to use (§2.4.3).
"""

from __future__ import annotations

from dataclasses import dataclass

WARMUP_ITERATIONS = 1
"""A job's first iteration builds its lazy state (Adam's moments, autograd's and the allocator's first-use paths,
cuDNN's autotuning on a GPU) and can take several times a steady one: it counts against the iterations left, and
FAIR charges it, but it is not averaged (the executor's memory profiler skips it likewise)."""
EWMA_WEIGHT = 0.3
"""How far one measured iteration moves the estimate: an outlier shifts it by under a third, and a lasting change
is followed within about five iterations (0.7^5 = 0.17 of the old estimate left)."""


@dataclass
class IterationClock:
    """A job's seconds per iteration (prior, then measured) and the iterations it has left.

    ``left``: iterations still to run (None: unknown, the job has not said); ``per_iteration_s``: the moving average,
    started at the prior (None: no prior and nothing measured yet); ``measured``: steady iterations averaged in;
    ``seen``: iterations ended so far. Example: ``c = IterationClock(); c.start(10, prior_total_s=10.0)``, then
    ``c.observe(5.0)`` (warm-up: 9 left x 1 s) and ``c.observe(2.0)``: 8 left x (0.3 x 2 + 0.7 x 1) = 10.4 s.
    """

    left: int | None = None
    per_iteration_s: float | None = None
    measured: int = 0
    seen: int = 0

    def start(self, iterations: int, prior_total_s: float | None) -> None:
        """The job will run ``iterations`` more iterations; before anything is measured its seconds per iteration are
        the prior ``prior_total_s / iterations`` (its declared total, if any)."""
        self.left = iterations
        if not self.measured and prior_total_s is not None:
            self.per_iteration_s = prior_total_s / iterations

    def observe(self, seconds: float, iterations: int = 1, measured: bool = True) -> None:
        """``iterations`` iterations ended after ``seconds`` of GPU time in all. ``measured=False``: they count
        against the iterations left but not as a measurement (an iteration that held its token past its bound:
        its time is the stop, not the work); nor do the job's first ``WARMUP_ITERATIONS``."""
        if self.left is not None:
            self.left = max(0, self.left - iterations)
        warm = self.seen >= WARMUP_ITERATIONS
        self.seen += iterations
        if not measured or not warm:
            return
        per = seconds / iterations
        self.per_iteration_s = per if self.per_iteration_s is None else \
            EWMA_WEIGHT * per + (1 - EWMA_WEIGHT) * self.per_iteration_s
        self.measured += iterations

    def remaining_s(self, prior_s: float | None, used_s: float) -> float:
        """Seconds per iteration x iterations left; where the job never said how many iterations it runs, or has
        neither a prior nor a steady measurement yet, the authors' rule: ``prior_s`` (declared total) - ``used_s``."""
        if self.left is not None and self.per_iteration_s is not None:
            return self.per_iteration_s * self.left
        return max(0.0, (prior_s or 0.0) - used_s)
