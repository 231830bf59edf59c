"""Epoch reaction (Nexus Fig. 13, §7.4): a step in load, its detection by the epoch planner's
beacons, and the bad-rate spike until the new plan serves it.

The paper (§7.4) steps the load up and reads off how long Nexus takes to notice (12 s there, at most one
30 s epoch) and what the step costs in bad requests before the new plan's GPUs take over (0.27 % bad over
the run). Here the timeline is simulated one beacon at a time with the real planner
(:class:`gpu.schedulers.nexus.epoch.EpochPlanner`) inside the Nexus controller the serving flow runs: each
beacon's arrivals run against the plan in force (:func:`gpu.sim.nexus.engine.simulate_plan`), the beacon's
measured per-session rates (the Poisson counts, as the frontends report them) go to its ``on_epoch`` hook, and
a new plan it decides serves from the next beacon on.

Approximation: queues do not carry over from one beacon to the next (each beacon starts empty and drains).
With SLOs of 50–200 ms against 1 s beacons that moves at most one SLO's worth of requests per beacon across
a boundary; the spike is measured per beacon either way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from gpu.systems import make_batch_policy
from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Session, SquishyPacker
from gpu.schedulers.nexus.controller import NexusController
from gpu.schedulers.nexus.epoch import EpochConfig, EpochPlanner
from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.sim.nexus.engine import simulate_plan


@dataclass(frozen=True)
class Beacon:
    """One beacon interval ``[t_s - beacon, t_s)``: what was offered, how much of it was bad, on how many GPUs."""

    t_s: float
    offered: int
    bad: int
    gpus: int
    replanned: bool  # a new plan came out of this beacon's epoch (it serves from the next beacon)

    @property
    def bad_rate(self) -> float:
        return self.bad / self.offered if self.offered else 0.0


@dataclass(frozen=True)
class EpochTimeline:
    """The beacons of one run, the step's time and the epochs the planner ran."""

    beacons: tuple[Beacon, ...]
    step_at_s: float
    epochs_s: tuple[float, ...]

    @property
    def beacon_s(self) -> float:
        return self.beacons[1].t_s - self.beacons[0].t_s if len(self.beacons) > 1 else 1.0

    @property
    def detection_delay_s(self) -> float | None:
        """From the step to the first epoch after it (what the early trigger or the timer reacts in)."""
        return next((b.t_s - self.step_at_s for b in self.beacons if b.t_s > self.step_at_s and b.replanned), None)

    @property
    def gpus_before(self) -> int:
        return max((b.gpus for b in self.beacons if b.t_s <= self.step_at_s), default=0)

    @property
    def gpus_after(self) -> int:
        return self.beacons[-1].gpus if self.beacons else 0

    @property
    def gpu_reaction_s(self) -> float | None:
        """From the step to the epoch whose plan first holds more GPUs (the paper's 12 s, Fig. 13)."""
        more = next((b for b in self.beacons if b.t_s > self.step_at_s and b.gpus > self.gpus_before), None)
        return None if more is None else more.t_s - self.beacon_s - self.step_at_s

    def _rate(self, beacons: Sequence[Beacon]) -> float:
        offered = sum(b.offered for b in beacons)
        return sum(b.bad for b in beacons) / offered if offered else 0.0

    @property
    def steady_bad_rate(self) -> float:
        """Bad rate before the step."""
        return self._rate([b for b in self.beacons if b.t_s <= self.step_at_s])

    @property
    def spike_bad_rate(self) -> float:
        """Worst beacon's bad rate after the step."""
        return max((b.bad_rate for b in self.beacons if b.t_s > self.step_at_s), default=0.0)

    @property
    def bad_rate(self) -> float:
        """Bad requests over the whole run (the paper's 0.27 %)."""
        return self._rate(self.beacons)


def step_timeline(profiles: Mapping[str, BatchProfile], sessions: Sequence[Session], *, step_at_s: float,
                  scale: float, duration_s: float, preset: str = "paper", config: EpochConfig | None = None,
                  batch_policy: str = "early_drop", arrivals: str = "poisson", seed: int = 0) -> EpochTimeline:
    """Serve ``sessions`` for ``duration_s`` with their rates × ``scale`` from ``step_at_s`` on, re-planning by
    Nexus's epoch rules (``config``: 30 s epochs, 1 s beacons, early trigger outside 0.8–1.1× by default)."""
    config = config or EpochConfig()
    if not 0 < step_at_s < duration_s:
        raise ConfigError("step_at_s", step_at_s, f"must fall inside the run (0, {duration_s}) s")
    if not scale > 0:
        raise ConfigError("scale", scale, "must be > 0")
    planner = EpochPlanner(SquishyPacker(profiles, preset), sessions, config)
    controller = NexusController(planner, rng=seed)
    policy = make_batch_policy(batch_policy)
    beacons: list[Beacon] = []
    plan = controller.plan
    n = int(round(duration_s / config.beacon_s))
    for k in range(1, n + 1):
        t = k * config.beacon_s
        factor = scale if t > step_at_s else 1.0
        rates = {s.session_id: s.rate * factor for s in sessions}
        res = simulate_plan(plan, profiles, policy, rates=rates, duration_s=config.beacon_s, arrivals=arrivals,
                            seed=seed * 100_003 + k, controller=controller)
        measured = {sid: st.offered / config.beacon_s for sid, st in res.sessions.items()}
        decision = controller.on_epoch(t, measured)
        beacons.append(Beacon(t, res.total("offered"), res.total("late") + res.total("dropped"), plan.num_gpus,
                              decision.replanned))
        plan = decision.plan
    return EpochTimeline(tuple(beacons), float(step_at_s), tuple(planner.epochs))


def scaled(sessions: Sequence[Session], load: float) -> list[Session]:
    """The sessions with every rate × ``load``."""
    return [replace(s, rate=s.rate * load) for s in sessions]
