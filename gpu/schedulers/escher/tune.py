"""EscherTune's ESL (Bhardwaj, ESCHER, thesis §4.5, Fig. 4.6c): where a trial's workers start, when a spread trial
is consolidated onto fewer nodes, and the move itself, as ``set_resource`` calls on the trial's ``trial-<id>``
resource. ``tasks/escher/tune.py`` runs it on real tasks (the workers checkpoint and stop, ``trial-<id>`` moves,
and the relaunched workers, with unchanged requests, resume there); ``gpu.sim.escher.workloads.tune`` runs the same
functions on the simulated 12-GPU cluster of Fig. 4.6c.

"EscherTune triggers a migration whenever it detects sufficient available resources to place all workers of a job
on the same node" (§4.5). A move costs a checkpoint and a relaunch, which the paper does not weigh; here the trial's
own measurements do: it moves only while the steps it has left, at the rate it measures, take longer than its last
launch took (launch to first step), so a trial about to finish is not stopped to be moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from gpu.placement import NodeState
from gpu.schedulers.escher.api import Actions, Escher, SetResource
from gpu.schedulers.escher.trials import worker_room


@dataclass(frozen=True)
class TrialProgress:
    """What a running trial measured: ``step`` of ``total`` steps done, its iteration rate (steps/s) since its
    workers last launched, and that launch's cost (seconds from launching the workers to their first step)."""

    step: int
    total: int
    rate: float
    launch_s: float

    @property
    def remaining_s(self) -> float:
        """Seconds the trial still needs at its measured rate."""
        return (self.total - self.step) / self.rate


@dataclass(frozen=True)
class Consolidation:
    """Move the trial: its workers per node after the move, and the measurements that made it pay."""

    counts: tuple[tuple[str, int], ...]
    remaining_s: float
    launch_s: float

    @property
    def nodes(self) -> dict[str, int]:
        return dict(self.counts)


def spread_by_availability(free: Sequence[NodeState], workers: int, share: float) -> tuple[tuple[str, int], ...] | None:
    """Where a new trial's workers start (§4.6: "spread across the cluster depending on GPU availability"): as many
    as fit on each node, in node order; None when the pool has no room for all of them now."""
    counts, left = [], workers
    for node in sorted(free, key=lambda n: n.name):
        take = min(left, worker_room(node, share))
        if take:
            counts.append((node.name, take))
            left -= take
        if left == 0:
            return tuple(counts)
    return None


def consolidation(free: Sequence[NodeState], placement: Mapping[str, int], share: float,
                  progress: TrialProgress | None) -> Consolidation | None:
    """EscherTune's trigger: a trial spread over several nodes moves onto fewer once they have room for all its
    workers (the room its own workers hold counted), the nodes holding most of its workers kept first. Only a
    measured trial moves, and only while its remaining time at its measured rate exceeds its measured launch cost.

    Args:
        free: the ledger's free state (``free_state()``), the trial's own workers still holding their shares.
        placement: node -> the trial's workers there now.
        share: GPUs per worker.
        progress: the trial's measurements, None until it has a rate.
    """
    if progress is None or progress.rate <= 0 or len(placement) < 2:
        return None
    workers = sum(placement.values())
    room = {n.name: worker_room(n, share) + placement.get(n.name, 0) for n in free}
    counts, left = [], workers
    for node in sorted(room, key=lambda n: (-min(room[n], workers), -placement.get(n, 0), n)):
        take = min(left, room[node])
        if take:
            counts.append((node, take))
            left -= take
        if left == 0:
            break
    if left or len(counts) >= len(placement) or progress.remaining_s <= progress.launch_s:
        return None
    return Consolidation(tuple(sorted(counts)), progress.remaining_s, progress.launch_s)


def trial_resources(trial: str, counts: Sequence[tuple[str, int]], nodes: Sequence[str]) -> Actions:
    """EscherTune's placement and migration (§4.5, Fig. 4.6c) as calls: ``trial-<id>`` deleted on every other node
    of ``nodes`` and set on ``counts``' nodes with capacity = the trial's workers there, so the workers, which request
    one unit each and never change their requests, land there when (re)launched."""
    keep = dict(counts)
    return Actions(tuple(SetResource(f"trial-{trial}", 0.0, n) for n in sorted(nodes) if n not in keep)
                   + tuple(SetResource(f"trial-{trial}", float(w), n) for n, w in counts))


def place_trial(esl: Escher, trial: str, counts: Sequence[tuple[str, int]]) -> None:
    """Apply ``trial_resources`` through ``esl`` (the flow's world; the simulator applies them after its delay)."""
    esl.apply(trial_resources(trial, counts, list(esl.get_cluster_status())))
