"""Nexus squishy bin packing: which model sessions run on which GPU, at what batch and duty cycle.

Nexus (Shen et al., SOSP'19) §6.1, Algorithm 1 (SQUISHYBINPACKING = SCHEDULESATURATE + SCHEDULERESIDUE
with MERGENODES, Fig. 7). A session ``S_i = ⟨M_k, L_i, R_i⟩`` first gets ``n = ⌊R_i/T_i⌋`` whole GPUs at its
max batch ``B_i`` (worst case 2ℓ(B_i) ≤ L_i); the residual rate ``r_i`` gets the largest batch with
``b/r + ℓ(b) ≤ L`` (Eq. 2), duty ``d = b/r`` and occupancy ``ℓ(b)/d``. Residuals are sorted by occupancy and
best-fit merged: a merged node takes the smaller duty cycle, every batch shrinks to ``⌈d·r⌉``, and the merge
is kept only if ``Σℓ(b') ≤ d``, every ``d + ℓ(b') ≤ L`` and the memory fits.

Baselines (§7.2; docs/nexus.md): ``batch_oblivious`` gives each session a share of the cluster
∝ R_i/T_i and runs every model at its solo max batch; ``no_colocation`` is Algorithm 1 without merging.

Example: ``SquishyPacker(profiles).plan([Session("a", "vgg16", 200, 700)])`` →
``Plan(nodes=(GpuNode(0, 96.4 ms, (SessionPlacement('a', batch=28, rate=290.6),)), …))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from gpu.errors import ConfigError
from gpu.schedulers.nexus.profiles import PAPER, PRESETS, TITAN_X_MEMORY_BYTES, Accounting, BatchProfile, fits

_EPS = 1e-9


@dataclass(frozen=True)
class Session:
    """Requests for one model under one latency SLO (ms) arriving at ``rate`` requests/s."""

    session_id: str
    model: str
    slo_ms: float
    rate: float

    def __post_init__(self) -> None:
        if not isinstance(self.slo_ms, (int, float)) or not self.slo_ms > 0:
            raise ConfigError(f"{self.session_id}.slo_ms", self.slo_ms, "must be a number > 0")
        if not isinstance(self.rate, (int, float)) or not math.isfinite(self.rate) or self.rate < 0:
            raise ConfigError(f"{self.session_id}.rate", self.rate, "must be a finite number >= 0 (requests/s)")


@dataclass(frozen=True)
class SessionPlacement:
    """One session's slice of one GPU: run ``batch`` inputs once per duty cycle, taking ``rate`` req/s."""

    session_id: str
    model: str
    slo_ms: float
    batch: int
    rate: float
    latency_ms: float
    worst_case_ms: float

    @property
    def meets_slo(self) -> bool:
        return fits(self.worst_case_ms, self.slo_ms)


@dataclass(frozen=True)
class GpuNode:
    """One GPU: sessions executed round-robin, one batch each per duty cycle (§6.3)."""

    node_id: int
    duty_cycle_ms: float
    placements: tuple[SessionPlacement, ...]
    saturated: bool = False
    memory_bytes: int = 0

    @property
    def busy_ms(self) -> float:
        return sum(p.latency_ms for p in self.placements)

    @property
    def occupancy(self) -> float:
        """Fraction of the duty cycle spent executing batches."""
        return self.busy_ms / self.duty_cycle_ms


@dataclass(frozen=True)
class Plan:
    """The decision of one epoch: GPU nodes and the routing share of every session."""

    strategy: str
    preset: str
    nodes: tuple[GpuNode, ...]
    sessions: tuple[Session, ...]
    unassigned: tuple[tuple[str, float], ...] = ()  # (session id, req/s) a capped cluster could not place

    @property
    def num_gpus(self) -> int:
        return len(self.nodes)

    def served_fraction(self, session_id: str) -> float:
        """Share of a session's requests the plan places within its SLO promise; the rest (``unassigned``) is
        still routed onto GPUs at run time (``nexus_overflow.route_unassigned``), where it fits or unpromised."""
        placed = sum(p.rate for n in self.nodes for p in n.placements if p.session_id == session_id)
        left = sum(r for s, r in self.unassigned if s == session_id)
        return placed / (placed + left) if placed + left > 0 else 0.0

    def rate_shares(self) -> dict[str, dict[int, float]]:
        """Routing table: session id → {node id: fraction of its requests sent there}."""
        rates: dict[str, dict[int, float]] = {}
        for node in self.nodes:
            for p in node.placements:
                rates.setdefault(p.session_id, {})[node.node_id] = p.rate
        return {s: {n: r / sum(by.values()) for n, r in by.items()} for s, by in rates.items()}

    def violations(self) -> list[str]:
        """Human-readable reasons this plan cannot meet every SLO (empty when it can)."""
        out = []
        for node in self.nodes:
            if not fits(node.busy_ms, node.duty_cycle_ms):
                out.append(f"node {node.node_id}: busy {node.busy_ms:.2f} ms > duty {node.duty_cycle_ms:.2f} ms")
            out += [f"node {node.node_id}: {p.session_id} worst case {p.worst_case_ms:.2f} ms > SLO {p.slo_ms} ms"
                    for p in node.placements if not p.meets_slo]
        return out

    def to_dict(self) -> dict:
        """Plain JSON-able form for a runtime or a flow artifact."""
        return {
            "strategy": self.strategy, "preset": self.preset, "num_gpus": self.num_gpus,
            "nodes": [{"node_id": n.node_id, "duty_cycle_ms": n.duty_cycle_ms, "occupancy": n.occupancy,
                       "saturated": n.saturated,
                       "sessions": [{"session_id": p.session_id, "model": p.model, "batch": p.batch,
                                     "rate": p.rate, "slo_ms": p.slo_ms} for p in n.placements]}
                      for n in self.nodes],
            "rate_shares": {s: {str(k): v for k, v in d.items()} for s, d in self.rate_shares().items()},
            "unassigned": dict(self.unassigned),
        }


def ceil_batch(x: float, eps: float = 1e-3) -> int:
    """⌈x⌉ that forgives float noise: floor(x) when x is within ``eps`` above a non-zero integer (code)."""
    f = math.floor(x)
    return int(f) if x - f < eps and f != 0 else int(math.ceil(x))


@dataclass
class _Member:
    session: Session
    profile: BatchProfile
    rate: float
    cap: int       # saturated max batch B_i
    duty_ms: float  # this residual's own (largest) duty cycle d_i


@dataclass
class _Node:
    members: list[_Member]
    duty_ms: float
    batches: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    @property
    def occupancy(self) -> float:
        return sum(self.latencies) / self.duty_ms


def _resolve(profiles: Mapping[str, BatchProfile], s: Session) -> BatchProfile:
    if s.model not in profiles:
        raise ConfigError(f"{s.session_id}.model", s.model, f"unknown model; profiles exist for {sorted(profiles)}")
    return profiles[s.model]


def _accounting(preset: str | Accounting) -> Accounting:
    if isinstance(preset, Accounting):
        return preset
    if preset not in PRESETS:
        raise ConfigError("preset", preset, f"unknown; choose one of {sorted(PRESETS)}")
    return PRESETS[preset]


@dataclass(frozen=True)
class SquishyPacker:
    """Algorithm 1 over a profile database.

    Args:
        profiles: model name → batching profile (one GPU type).
        preset: latency accounting, ``"paper"`` or ``"code"`` (``nexus_profiles.PRESETS``).
        device_memory_bytes: a merge is refused when the sessions' memory at their max batch exceeds it.
        sort_key: residual order, ``"occupancy"`` (Algorithm 1) or ``"rate"`` (the authors' code).
        colocate: False gives the ``no_colocation`` baseline (every residual alone on a GPU).
    """

    profiles: Mapping[str, BatchProfile]
    preset: str | Accounting = "paper"
    device_memory_bytes: int = TITAN_X_MEMORY_BYTES
    sort_key: str = "occupancy"
    colocate: bool = True

    def __post_init__(self) -> None:
        _accounting(self.preset)
        if self.sort_key not in ("occupancy", "rate"):
            raise ConfigError("sort_key", self.sort_key, "choose 'occupancy' or 'rate'")
        if self.device_memory_bytes <= 0:
            raise ConfigError("device_memory_bytes", self.device_memory_bytes, "must be > 0")

    @property
    def accounting(self) -> Accounting:
        return _accounting(self.preset)

    def max_throughput(self, session: Session) -> tuple[int, float]:
        """``(B_i, T_i)``: the solo max batch and the requests/s one GPU serves at it."""
        p, acc = _resolve(self.profiles, session), self.accounting
        b = acc.max_batch(p, session.slo_ms, session.session_id)
        return b, 1000.0 * b / acc.latency(p, b)

    def plan(self, sessions: Sequence[Session], max_gpus: int | None = None) -> Plan:
        """SQUISHYBINPACKING: saturated nodes first, then best-fit merged residual nodes.

        With ``max_gpus`` (a fixed cluster) the residual nodes beyond the cap are spilled, least occupied
        first, into the remaining nodes, splitting a session's rate where only part of it fits — the
        authors' ``FindBestBackend``/``AllocateUnassignedWorkloads`` greedy (their ``scheduler.cpp``); what
        still does not fit is returned in ``Plan.unassigned`` (the code drops it at the frontend; here it is
        spilled at run time onto GPUs where it fits its SLO, the rest left to the dispatcher,
        ``nexus_overflow.route_unassigned``).
        """
        acc = self.accounting
        _check_unique(sessions)
        if max_gpus is not None and (isinstance(max_gpus, bool) or not isinstance(max_gpus, int) or max_gpus < 1):
            raise ConfigError("gpus", max_gpus, "must be an integer >= 1")
        nodes: list[GpuNode] = []
        residuals: list[_Member] = []
        unassigned: dict[str, float] = {}
        for s in sessions:  # SCHEDULESATURATE
            p = _resolve(self.profiles, s)
            cap, tput = self.max_throughput(s)
            n = int(math.floor(s.rate / tput + _EPS))
            lat = acc.latency(p, cap)
            for _ in range(n):
                if max_gpus is not None and len(nodes) >= max_gpus:
                    unassigned[s.session_id] = unassigned.get(s.session_id, 0.0) + tput
                    continue
                nodes.append(GpuNode(len(nodes), lat, (SessionPlacement(s.session_id, s.model, s.slo_ms, cap, tput, lat,
                                                                  acc.worst_case(p, lat, cap)),),
                                     saturated=True, memory_bytes=p.memory(cap)))
            r = s.rate - n * tput
            if r > 1e-6 * max(1.0, s.rate):
                residuals.append(self._member(s, r))
        packed = self._schedule_residue(residuals)
        if max_gpus is not None:
            packed = self._spill(packed, max_gpus - len(nodes), unassigned)
        for node in packed:
            nodes.append(self._freeze(node, len(nodes)))
        return Plan("squishy" if self.colocate else "no_colocation", acc.name, tuple(nodes), tuple(sessions),
                    tuple(sorted(unassigned.items())))

    def _member(self, s: Session, rate: float) -> _Member:
        p = _resolve(self.profiles, s)
        cap = self.accounting.max_batch(p, s.slo_ms, s.session_id)
        return _Member(s, p, rate, cap, self.accounting.residual(p, s.slo_ms, rate, cap)[1])

    def _spill(self, nodes: list[_Node], budget: int, unassigned: dict[str, float]) -> list[_Node]:
        """Evict the least-occupied residual nodes until ``budget`` remain; re-place their rates, split if need be."""
        nodes = list(nodes)
        while len(nodes) > max(budget, 0):
            evicted = nodes.pop(min(range(len(nodes)), key=lambda j: nodes[j].occupancy))
            for m in sorted(evicted.members, key=lambda m: -m.rate):
                left = m.rate
                while left > 1e-6 * max(1.0, m.rate):
                    best: tuple[tuple[bool, float], int, _Node, float] | None = None
                    for j, node in enumerate(nodes):
                        x, merged = self._largest_share(node, m.session, left)
                        if merged is None:
                            continue
                        # whole rate fits → best fit (highest occupancy); else the most rate (code rule)
                        key = (x >= left - 1e-9, merged.occupancy if x >= left - 1e-9 else x)
                        if best is None or key > best[0]:
                            best = (key, j, merged, x)
                    if best is None:
                        break
                    _, j, nodes[j], x = best
                    left -= x
                if left > 1e-6 * max(1.0, m.rate):
                    sid = m.session.session_id
                    unassigned[sid] = unassigned.get(sid, 0.0) + left
        return nodes

    def _largest_share(self, node: _Node, s: Session, left: float) -> tuple[float, _Node | None]:
        """Most of ``left`` req/s of ``s`` that ``node`` can take (bisection), and the merged node."""
        if not self.colocate:
            return 0.0, None
        have = sum(m.rate for m in node.members if m.session.session_id == s.session_id)
        others = [m for m in node.members if m.session.session_id != s.session_id]

        def merged(x: float) -> _Node | None:
            return self._merge(others + [self._member(s, have + x)])

        whole = merged(left)
        if whole is not None:
            return left, whole
        lo, lo_node, hi = 0.0, None, left
        for _ in range(20):
            mid = (lo + hi) / 2
            trial = merged(mid)
            lo, lo_node, hi = (mid, trial, hi) if trial is not None else (lo, lo_node, mid)
        return (lo, lo_node) if lo_node is not None and lo > 1e-3 * left else (0.0, None)

    def _schedule_residue(self, residuals: list[_Member]) -> list[_Node]:
        singles = [self._merge([m]) for m in residuals]
        order = sorted(range(len(residuals)), key=lambda i: -(singles[i].occupancy if self.sort_key == "occupancy"
                                                             else residuals[i].rate))
        nodes: list[_Node] = []
        for i in order:
            best, best_at = None, -1
            if self.colocate:
                for j, node in enumerate(nodes):
                    merged = self._merge(node.members + [residuals[i]])
                    if merged is not None and (best is None or merged.occupancy > best.occupancy):
                        best, best_at = merged, j
            if best is not None:
                nodes[best_at] = best
            else:
                nodes.append(singles[i])
        return nodes

    def _merge(self, members: list[_Member]) -> _Node | None:
        """MERGENODES: shared duty = min of the members' duties, batches ⌈d·r⌉; None if it does not fit."""
        acc = self.accounting
        d = min(m.duty_ms for m in members)
        node = _Node(members, d)
        for m in members:
            b = ceil_batch(d * m.rate / 1000.0)
            if b > m.cap or not fits(acc.worst_case(m.profile, d, b), m.session.slo_ms):
                return None
            node.batches.append(b)
            node.latencies.append(acc.latency(m.profile, b))
        if len(members) > 1:
            if not fits(sum(node.latencies), d):
                return None
            if sum(m.profile.memory(m.cap) for m in members) > self.device_memory_bytes:
                return None
        return node

    def _freeze(self, node: _Node, node_id: int) -> GpuNode:
        acc = self.accounting
        placements = tuple(
            SessionPlacement(m.session.session_id, m.session.model, m.session.slo_ms, b, m.rate, lat,
                      acc.worst_case(m.profile, node.duty_ms, b))
            for m, b, lat in zip(node.members, node.batches, node.latencies))
        mem = sum(m.profile.memory(m.cap) for m in node.members)
        return GpuNode(node_id, node.duty_ms, placements, saturated=False, memory_bytes=mem)


def _check_unique(sessions: Sequence[Session]) -> None:
    seen: set[str] = set()
    for s in sessions:
        if s.session_id in seen:
            raise ConfigError("session_id", s.session_id, "appears twice")
        seen.add(s.session_id)


def batch_oblivious_plan(sessions: Sequence[Session], profiles: Mapping[str, BatchProfile],
                         preset: str | Accounting = PAPER, gpus: int | None = None) -> Plan:
    """The paper's batch-oblivious scheduler (§7.2): cluster shares ∝ R_i/T_i, solo max batch everywhere.

    Shares are scaled to fill ``gpus`` GPUs (default ``⌈Σ R_i/T_i⌉``) and laid end to end in decreasing
    order, so a GPU hosts the sessions whose share overlaps it; each runs its solo max batch ``B_i``
    round-robin (duty = Σ ℓ(B_i)), blind to the latency cost of co-location — ``Plan.violations`` shows it.
    """
    acc = _accounting(preset)
    _check_unique(sessions)
    if gpus is not None and (not isinstance(gpus, int) or gpus < 1):
        raise ConfigError("gpus", gpus, "must be an integer >= 1")
    packer = SquishyPacker(profiles, acc)
    info = []
    for s in sessions:
        b, t = packer.max_throughput(s)
        if s.rate > 0:
            info.append((s, _resolve(profiles, s), b, s.rate / t))
    total = sum(x[3] for x in info)
    g = gpus or max(1, math.ceil(total - 1e-9))
    scale = g / total if total > 0 else 0.0
    info.sort(key=lambda x: -x[3])
    per_gpu: list[list[tuple]] = [[] for _ in range(g)]
    start = 0.0
    for s, p, b, share in info:
        lo, hi = start, start + share * scale
        for k in range(int(math.floor(lo)), min(g, int(math.ceil(hi - 1e-9)))):
            overlap = min(hi, k + 1) - max(lo, k)
            if overlap > 1e-9:
                per_gpu[k].append((s, p, b, s.rate * overlap / (share * scale)))
        start = hi
    nodes = []
    for k, members in enumerate(m for m in per_gpu if m):
        duty = sum(acc.latency(p, b) for _, p, b, _ in members)
        placements = tuple(SessionPlacement(s.session_id, s.model, s.slo_ms, b, r, acc.latency(p, b),
                                     acc.worst_case(p, duty, b)) for s, p, b, r in members)
        nodes.append(GpuNode(k, duty, placements, saturated=len(members) == 1,
                             memory_bytes=sum(p.memory(b) for _, p, b, _ in members)))
    return Plan("batch_oblivious", acc.name, tuple(nodes), tuple(sessions))


def gpu_lower_bound(sessions: Sequence[Session], profiles: Mapping[str, BatchProfile]) -> float:
    """§7.4 lower bound Σ R_i / T_i^opt: best throughput over all batch sizes, ignoring SLOs."""
    total = 0.0
    for s in sessions:
        p = _resolve(profiles, s)
        total += s.rate / max(1000.0 * b / p.latency(b) for b in p.batches)
    return total
