"""Salus's iteration schedulers: which job in a lane runs the next iteration (thesis §2.4, §2.5.1).

Switching happens only at iteration boundaries and costs no data movement: every admitted job's persistent
memory stays resident (§2.3.2), so a policy is just a choice among the jobs of a free lane. Each policy also
says how jobs are *admitted*, matching how the thesis evaluated it:

* ``FIFO`` — "processing jobs in order of their arrival", one job on the device at a time (Table 2.1's
  baseline, the de facto exclusive GPU).
* ``PACK`` — "pack as many jobs as possible" into lanes with Algorithm 2.1 (§2.4.1); inside a lane,
  round-robin by iteration (our choice; the thesis orders nothing).
* ``SRTF`` — preemptive shortest-remaining-time-first (§2.4.2) in one shared lane: a job is admitted when
  ``sum P + P + max(E, L) <= C`` (Alg. 2.1 with one lane); remaining = measured seconds per iteration x
  iterations left, the declared total only a prior (``gpu.schedulers.salus.estimates``). Queued jobs retry
  shortest first.
* ``FAIR`` — "equalize total service over time for jobs in each lane" (§2.4.3) in one shared lane (the
  fast-switching experiments "consider a single GPU lane", §2.5.1.2); service = GPU time since the lane's
  membership last grew (the authors' code resets counters when a job joins) or an on-demand job asked for its
  first iteration (a real job joins the competition only then: no catch-up for the time it was starting),
  quantum one iteration.
* ``WeightedFair`` — *our extension*: service divided by a per-job weight, so a scheduler's GPU split
  (e.g. Ekya's retraining/inference split) becomes time shares of one lane.

Every policy is a pure ``decide(LaneSnapshot) -> job_id``; the controller owns the counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpu.errors import ConfigError

ADMISSIONS = ("exclusive", "one_lane", "lanes")
"""How a policy admits jobs: one job at a time, one shared lane (Alg. 2.1 with one lane), or Alg. 2.1 in full."""


@dataclass(frozen=True)
class Candidate:
    """One admitted job of a free lane, as a policy sees it.

    ``seq``: arrival order; ``served_s``: measured GPU time since the lane's membership last grew (FAIR);
    ``remaining_s``: the controller's estimate of the GPU time it still needs (SRTF,
    ``gpu.schedulers.salus.estimates``); ``last_run``: the controller's iteration counter when it last ran
    (-1 = never).
    """

    job_id: str
    seq: int
    served_s: float = 0.0
    remaining_s: float = 0.0
    weight: float = 1.0
    last_run: int = -1


@dataclass(frozen=True)
class LaneSnapshot:
    """A free lane and its admitted jobs (non-empty)."""

    lane_id: int
    candidates: tuple[Candidate, ...]


class LanePolicy(Protocol):
    """Picks the next iteration of a lane; ``queue_key`` orders jobs waiting for admission."""

    name: str
    admission: str
    needs_expected_time: bool

    def decide(self, snapshot: LaneSnapshot) -> str: ...

    def queue_key(self, candidate: Candidate) -> tuple: ...


class Fifo:
    """Arrival order, exclusive device (Table 2.1's FIFO)."""

    name, admission, needs_expected_time = "fifo", "exclusive", False

    def decide(self, snapshot: LaneSnapshot) -> str:
        return min(snapshot.candidates, key=lambda c: c.seq).job_id

    def queue_key(self, candidate: Candidate) -> tuple:
        return (candidate.seq,)


class Pack(Fifo):
    """Algorithm 2.1 lanes; round-robin by iteration inside a lane (least recently run first)."""

    name, admission = "pack", "lanes"

    def decide(self, snapshot: LaneSnapshot) -> str:
        return min(snapshot.candidates, key=lambda c: (c.last_run, c.seq)).job_id


class Srtf(Fifo):
    """Shortest remaining GPU time first (measured per iteration x iterations left; before a job's first measured
    iteration its declared total − used); pre-empts only at iteration boundaries."""

    name, admission, needs_expected_time = "srtf", "one_lane", True

    def decide(self, snapshot: LaneSnapshot) -> str:
        return min(snapshot.candidates, key=self.queue_key).job_id

    def queue_key(self, candidate: Candidate) -> tuple:
        return (candidate.remaining_s, candidate.seq)


class Fair(Fifo):
    """Least service first (GPU time, quantum one iteration), so shares equalise within a lane."""

    name, admission = "fair", "one_lane"

    def decide(self, snapshot: LaneSnapshot) -> str:
        return min(snapshot.candidates, key=lambda c: (self.service(c), c.last_run, c.seq)).job_id

    def service(self, candidate: Candidate) -> float:
        return candidate.served_s


class WeightedFair(Fair):
    """FAIR with ``service / weight`` (extension): a job of weight 2 gets twice the lane time of weight 1."""

    name = "weighted_fair"

    def service(self, candidate: Candidate) -> float:
        return candidate.served_s / candidate.weight


POLICIES: dict[str, type] = {"fifo": Fifo, "srtf": Srtf, "pack": Pack, "fair": Fair, "weighted_fair": WeightedFair}


def make_policy(name: str, admission: str | None = None) -> LanePolicy:
    """The policy called ``name``; ``admission`` overrides how it admits (e.g. FAIR across Alg. 2.1 lanes)."""
    if name not in POLICIES:
        raise ConfigError("policy", name, f"unknown; choose one of {sorted(POLICIES)}")
    policy = POLICIES[name]()
    if admission is not None:
        if admission not in ADMISSIONS:
            raise ConfigError("admission", admission, f"unknown; choose one of {list(ADMISSIONS)}")
        policy.admission = admission
    return policy
