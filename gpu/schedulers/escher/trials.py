"""Where a FLUID trial's data-parallel workers go on a pool of nodes, as ESCHER's ESL decides it (Bhardwaj, ESCHER,
thesis Table 4.2 P3 anti-affinity used as a preference, then P1 affinity; §4.5 EscherTune's trials): pure
decisions over the ledger's free state. ``tasks/fluid/escher.py`` turns a decision into ``trial-<id>``
resources, ghosts and workers on real tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from gpu.placement import NodeState

_EPS = 1e-9


@dataclass(frozen=True)
class TrialNodes:
    """The ESL's decision for one chunk of a trial: workers per node, and which policies it met.

    Example: ``TrialNodes("c0001@0", (("node0", 2), ("node1", 1)), 1.0, anti_affine=True, co_located=False)``.
    """

    trial_id: str
    counts: tuple[tuple[str, int], ...]
    share: float
    anti_affine: bool
    co_located: bool

    @property
    def workers(self) -> int:
        return sum(n for _, n in self.counts)

    @property
    def nodes(self) -> dict[str, int]:
        return dict(self.counts)


def worker_room(node: NodeState, share: float) -> int:
    """Workers of ``share`` GPUs each that fit on ``node`` now (whole idle devices when ``share >= 1``)."""
    if share >= 1:
        return sum(1 for d in node.devices if d.compute_free >= 1 - _EPS)
    return sum(int((d.compute_free + _EPS) // share) for d in node.devices)


def plan_trial_nodes(trial_id: str, workers: int, share: float, free: Sequence[NodeState],
                     others: Mapping[str, set[str]], current: Mapping[str, int]) -> TrialNodes | None:
    """Where ``workers`` workers of ``share`` GPU each go now, or None when the pool has no room for all of them.

    Args:
        free: the ledger's free state per node (``free_state()``).
        others: node -> ids of other trials running there (anti-affinity).
        current: the trial's own workers per node in its previous chunk (staying saves a move).
    """
    room = {n.name: worker_room(n, share) for n in free}
    alone = [n for n in room if not others.get(n)]
    for tier in (alone, list(room)):
        candidates = [n for n in tier if room[n] > 0]
        if sum(room[n] for n in candidates) < workers:
            continue
        single = [n for n in candidates if room[n] >= workers]
        if single:  # affinity: every worker on one node, the trial's own node first, then the tightest fit
            node = min(single, key=lambda n: (n not in current, room[n], n))
            counts = ((node, workers),)
        else:  # the fewest nodes: most room first
            counts_list, left = [], workers
            for n in sorted(candidates, key=lambda n: (-room[n], n not in current, n)):
                take = min(left, room[n])
                counts_list.append((n, take))
                left -= take
                if left == 0:
                    break
            counts = tuple(sorted(counts_list))
        return TrialNodes(trial_id, counts, share, anti_affine=not any(others.get(n) for n, _ in counts),
                          co_located=len(counts) == 1)
    return None


def worker_shape(width: float) -> tuple[int, float]:
    """FLUID's width as (workers, GPU share each): ``w >= 1`` is ``floor(w)`` whole GPUs, less a share of one."""
    return (max(1, int(width + _EPS)), 1.0) if width >= 1 else (1, float(width))
