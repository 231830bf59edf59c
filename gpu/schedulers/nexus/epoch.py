"""Epoch-based re-planning: when to re-run squishy bin packing and how to keep the previous placement.

Nexus (Shen et al., SOSP'19) §5 and §6.1 "incremental", and the authors' ``Scheduler::BeaconCheck``
/ ``EpochSchedule``. Every beacon (1 s) each session's measured rate updates an EWMA (window 10 s); an epoch
runs every 30 s, or early when a session with a full 30-sample history has an estimate below 0.8× or above
1.1× its allocated throughput, but never within 10 s of the previous epoch. At an epoch a session is re-sized
only if its estimate fell below 0.97× its throughput (shrink) or rose above it (grow); otherwise it keeps its
planned rate, so an unchanged workload keeps its plan.

Deviation (docs/nexus.md "Simplifications"): the changed rates are re-packed by Algorithm 1 from scratch rather than
by the code's shrink/grow/spill walk; new nodes are matched to old node ids by shared sessions so a runtime
only moves what changed, and the number of session moves is counted.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import GpuNode, Plan, Session, SquishyPacker


@dataclass(frozen=True)
class EpochConfig:
    """Timing and trigger thresholds (the authors' defaults; seconds and fractions of allocated throughput)."""

    epoch_s: float = 30.0
    min_epoch_s: float = 10.0
    beacon_s: float = 1.0
    avg_interval_s: float = 10.0
    low: float = 0.8
    high: float = 1.1
    shrink: float = 0.97

    def __post_init__(self) -> None:
        for name in ("epoch_s", "min_epoch_s", "beacon_s", "avg_interval_s", "low", "high", "shrink"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "must be > 0")
        if self.min_epoch_s > self.epoch_s:
            raise ConfigError("min_epoch_s", self.min_epoch_s, f"must be <= epoch_s={self.epoch_s}")

    @property
    def history(self) -> int:
        """Samples before a session may trigger an early epoch (code: (3·avg + beacon − 1)/beacon)."""
        return int((3 * self.avg_interval_s + self.beacon_s - 1) // self.beacon_s)


class EpochPlanner:
    """Keeps the current plan and re-plans on the epoch timer or on large rate changes.

    A flow calls :meth:`observe` once per beacon with the measured requests/s of every session; a returned
    plan replaces the previous one (push its nodes and ``rate_shares()`` to the runtime).

    ``max_gpus`` is the cluster: a plan that would need more GPUs is capped at it — residual rates spilled into
    the nodes it has, what does not fit in ``Plan.unassigned`` (``SquishyPacker.plan(max_gpus=...)``, the
    authors' FindBestBackend) — rather than asking the pool for GPUs it does not have.
    """

    def __init__(self, packer: SquishyPacker, sessions: Sequence[Session], config: EpochConfig | None = None,
                 start_s: float = 0.0, max_gpus: int | None = None):
        self.packer = packer
        self.config = config or EpochConfig()
        self.max_gpus = max_gpus
        self._planned = {s.session_id: s for s in sessions}
        self.plan: Plan = packer.plan(list(sessions), max_gpus)
        self.last_epoch_s = float(start_s)
        self.epochs: list[float] = []
        self.moves = 0
        self._alpha = 1.0 - math.exp(-self.config.beacon_s / self.config.avg_interval_s)
        self._ewma: dict[str, float] = {}
        self._hist: dict[str, deque] = {s: deque(maxlen=self.config.history) for s in self._planned}

    def estimate(self, session_id: str) -> float:
        """Current EWMA rate estimate (requests/s, at least 0.1 as in the code)."""
        return max(self._ewma.get(session_id, self._planned[session_id].rate), 0.1)

    def allocated(self, session_id: str) -> float:
        """Requests/s the current plan can serve for a session: Σ over its GPUs of batch / duty cycle."""
        return sum(1000.0 * p.batch / n.duty_cycle_ms for n in self.plan.nodes for p in n.placements
                   if p.session_id == session_id)

    def observe(self, now_s: float, rates: Mapping[str, float]) -> Plan | None:
        """One beacon: update the estimates; run an epoch if it is due; return the new plan or None."""
        for sid, r in rates.items():
            if sid not in self._planned:
                raise ConfigError("session_id", sid, "not a session of this planner")
            if not (isinstance(r, (int, float)) and r >= 0):
                raise ConfigError(f"{sid}.rate", r, "must be a number >= 0")
            prev = self._ewma.get(sid)
            self._ewma[sid] = float(r) if prev is None else prev + self._alpha * (float(r) - prev)
            self._hist[sid].append(self._ewma[sid])
        since = now_s - self.last_epoch_s
        trigger = any(self._out_of_band(sid) for sid in self._planned)
        if (trigger and since >= self.config.min_epoch_s) or since >= self.config.epoch_s:
            return self._epoch(now_s)
        return None

    def _out_of_band(self, sid: str) -> bool:
        if len(self._hist[sid]) < self.config.history:
            return False
        est, tp = self.estimate(sid), self.allocated(sid)
        return est < self.config.low * tp or est > self.config.high * tp

    def _epoch(self, now_s: float) -> Plan | None:
        self.last_epoch_s = now_s
        self.epochs.append(now_s)
        changed = False
        for sid, s in self._planned.items():
            est, tp = self.estimate(sid), self.allocated(sid)
            if sid in self._ewma and (est < self.config.shrink * tp or est > tp):
                self._planned[sid] = replace(s, rate=est)
                changed = True
        if not changed:
            return None
        new = self.packer.plan(list(self._planned.values()), self.max_gpus)
        self.plan = self._match_ids(new)
        return self.plan

    def _match_ids(self, new: Plan) -> Plan:
        """Give new nodes the ids of the old nodes they share most sessions with; count session moves."""
        old = {n.node_id: {p.session_id for p in n.placements} for n in self.plan.nodes}
        free = set(old)
        next_id = max(old, default=-1) + 1
        nodes: list[GpuNode] = []
        for n in sorted(new.nodes, key=lambda n: -len(n.placements)):
            mine = {p.session_id for p in n.placements}
            best = max(sorted(free), key=lambda k: len(mine & old[k]), default=None)
            if best is not None and mine & old[best]:
                free.discard(best)
                self.moves += len(mine - old[best])
                nodes.append(replace(n, node_id=best))
            else:
                self.moves += len(mine)
                nodes.append(replace(n, node_id=next_id))
                next_id += 1
        return replace(new, nodes=tuple(sorted(nodes, key=lambda n: n.node_id)))
