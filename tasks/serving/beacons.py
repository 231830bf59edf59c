"""What the serving rollout does at every beacon of its trace clock: the Nexus epoch rules and the measured feedback.

Nexus (Shen et al., SOSP'19, §6.3) measures each session's request rate every beacon and re-plans at epoch
boundaries (or early when a rate leaves its band); the load generator calls :class:`BeaconLoop` every
``beacon_s`` of trace. It hands the beacon's counts to ``EpochFeedback`` (ORLOJ's re-profiling, Nona's
re-solving; ``tasks.serving.epochs``) and to the ``NexusController`` the simulator drives, rolls out a new plan,
and keeps the epoch marks and per-beacon rows the figures are computed from (``tasks.serving.figures``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from gpu.schedulers.nexus.controller import NexusController
from gpu.schedulers.nexus.squishy import Plan
from tasks.serving.epochs import EpochFeedback
from tasks.serving.figures import EpochMark


@dataclass
class BeaconLoop:
    """One rollout's beacon handler (``LoadGenerator.run(on_beacon=...)``).

    Args:
        runtime: the ``LocalServingRuntime`` serving the plan (``take_counts``, ``apply``, ``plan``, ``gpu_share``).
        controller: the Nexus controller (its planner is None for the fixed plans of the per-query placements).
        feedback: the epoch feedback of ORLOJ and Nona.
        duration_s: the trace's length; its last beacon only records (nothing is left to serve on a new plan).
        beacon_s: seconds between beacons (counts become requests/s).
        on_beacon: told ``t_s`` every beacon (the flow's progress bar).
        on_replan: told ``(t_s, plan)`` when an epoch changed the plan (the flow's log line).
    """

    runtime: Any
    controller: NexusController
    feedback: EpochFeedback
    duration_s: float
    beacon_s: float
    on_beacon: Callable[[float], None] = lambda t_s: None
    on_replan: Callable[[float, Plan], None] = lambda t_s, plan: None
    marks: list[EpochMark] = field(default_factory=list)
    beacons: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.marks.append(EpochMark(0.0, self.controller.plan, True))

    def __call__(self, t_s: float) -> None:
        rt = self.runtime
        self.on_beacon(t_s)
        counts = rt.take_counts()
        if t_s < self.duration_s:
            self.feedback.on_beacon(t_s, counts)
            decision = self.controller.on_epoch(t_s, {sid: c / self.beacon_s for sid, c in counts.items()})
            if decision.replanned:
                rt.apply(decision.plan)
            if decision.epoch:
                self.marks.append(EpochMark(t_s, decision.plan, decision.replanned))
            if decision.replanned:
                self.on_replan(t_s, decision.plan)
        self.beacons.append({"t_s": t_s, "gpus": float(rt.plan.num_gpus), "gpu_share": rt.gpu_share})
