"""Route a capped plan's unassigned load onto GPUs: admission is the dispatcher's job, not the plan's.

Nexus §5–6: the frontend sends *every* request of a session to one of the session's backends by the routing
table, and the backends' early-drop dispatch (§6.3) absorbs overload by dropping what cannot meet its
deadline. A capped squishy plan (``SquishyPacker.plan(max_gpus=...)``) lists in ``Plan.unassigned`` the rate it
could not place within its worst-case promise (duty + ℓ(b) ≤ SLO); that load still arrives. This module turns
the capped plan into the plan the cluster actually runs (inferred; docs/nexus.md):

* first each session's unassigned rate is placed where it fits its SLO, the authors' ``FindBestBackend``
  (§6.1 "incremental", the authors' code) applied at run time at the nodes' planned duty cycles: at each step the GPU
  that can take the most of what is left (GPUs already hosting the session first; among those that take all
  of it, the one with the most slack ``d − Σℓ(b)``) takes it, a GPU that did not host the session gaining a
  new placement. A GPU takes rate ``x`` when the session's batch ``b = ⌈d·r⌉`` keeps ``Σℓ ≤ d``,
  ``d + ℓ(b) ≤ SLO``, ``b ≤ B`` and, for a new placement, the memory at ``B``. The rate may split across GPUs;
  routing shares follow the placed rates;
* what fits nowhere within its SLO is routed unpromised where it overbooks least: onto the session's planned
  GPUs by their shares (bigger batches, no new per-batch cost), or whole onto the GPU with memory for it
  that keeps the most slack once every placement serves its whole rate (a work-conserving GPU with slack
  cycles faster than its planned duty) — whichever leaves more. A session with no GPU that no GPU has
  memory for stays in ``unassigned`` and the frontend drops it;
* each touched placement runs the batch its duty cycle collects at the routed rate, ``⌈d·r⌉``, but no more
  than the largest batch whose worst case ``d + ℓ(b)`` meets the SLO (the MERGENODES rule; where none does,
  its max batch ``B``), and never less than its planned batch.

The result keeps every node's duty cycle, so ``Plan.violations()`` shows where occupancy now exceeds it:
the routed plan promises nothing for the overflow; the simulator measures what the dispatcher makes of it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session, ceil_batch
from gpu.schedulers.nexus.profiles import PRESETS, TITAN_X_MEMORY_BYTES, Accounting, BatchProfile, fits

_TOL = 1e-6  # relative rate below which a remainder counts as placed


def route_unassigned(plan: Plan, profiles: Mapping[str, BatchProfile], accounting: Accounting | None = None,
                     device_memory_bytes: int = TITAN_X_MEMORY_BYTES) -> Plan:
    """The plan with ``plan.unassigned`` routed onto GPUs (see the module docstring); its ``unassigned`` keeps
    only the sessions no GPU has memory for."""
    if not plan.unassigned or not plan.nodes:
        return plan
    acc = accounting or PRESETS[plan.preset]
    by_id = {s.session_id: s for s in plan.sessions}
    nodes = {n.node_id: n for n in plan.nodes}
    planned = plan.rate_shares()
    dropped = []
    for sid, rate in sorted(plan.unassigned, key=lambda x: (-x[1], x[0])):
        s, prof = by_id[sid], profiles[by_id[sid].model]
        left = _spill(nodes, s, prof, acc, rate, device_memory_bytes)
        if left <= _TOL * rate:
            continue
        if not _overbook(nodes, s, profiles, acc, left, planned.get(sid, {}), device_memory_bytes):
            dropped.append((sid, left))
    return Plan(plan.strategy, plan.preset, tuple(nodes[n.node_id] for n in plan.nodes), plan.sessions,
                tuple(sorted(dropped)))


def _spill(nodes: dict[int, GpuNode], s: Session, prof: BatchProfile, acc: Accounting, rate: float,
           memory_limit: int) -> float:
    """Place up to ``rate`` req/s of ``s`` where it fits its SLO, GPUs hosting it first; return what is left.

    Each step picks the node that takes the most of what is left (the whole of it, if any can, on the node
    with the most duty-cycle slack) — FindBestBackend applied at the nodes' planned duty cycles.
    """
    cap = acc.max_batch(prof, s.slo_ms, s.session_id)
    memory = prof.memory(cap)
    left = rate
    while left > _TOL * rate:
        best = None
        for n in nodes.values():
            x, placed = _take(n, s, prof, acc, cap, left, memory_limit - memory)
            if placed is None:
                continue
            key = (_hosts(n, s.session_id), x, n.duty_cycle_ms - n.busy_ms, -n.node_id)
            if best is None or key > best[0]:
                best = (key, n, placed, x)
        if best is None:
            break
        _, n, placed, x = best
        hosted = _hosts(n, s.session_id)
        nodes[n.node_id] = (replace(n, placements=tuple(placed if p.session_id == s.session_id else p
                                                         for p in n.placements)) if hosted
                            else _with(n, placed, memory))
        left -= x
    return max(left, 0.0)


def _overbook(nodes: dict[int, GpuNode], s: Session, profiles: Mapping[str, BatchProfile], acc: Accounting,
              left: float, shares: Mapping[int, float], memory_limit: int) -> bool:
    """Route ``left`` req/s of ``s`` that fits nowhere within its SLO, unpromised, where it overbooks least.

    Either onto its planned GPUs by their shares (bigger batches, no new per-batch cost) or whole onto the
    GPU, among those with memory for its model, left with the most duty-cycle slack after it is added (a
    work-conserving GPU with slack cycles faster than its planned duty); whichever leaves the larger
    smallest slack. False when the session has no GPU and no GPU has memory for it.
    """
    prof = profiles[s.model]

    def slack(n: GpuNode) -> float:  # duty left once every placement serves its whole rate, batches uncapped
        return n.duty_cycle_ms - sum(_demand_ms(acc, profiles[p.model], n.duty_cycle_ms, p.rate)
                                     for p in n.placements)

    def grown(n: GpuNode, add: float) -> GpuNode:
        return replace(n, placements=tuple(_rerouted(p, p.rate + add, n.duty_cycle_ms, prof, acc, p.batch)
                                           if p.session_id == s.session_id else p for p in n.placements))

    options: list[tuple[float, dict[int, GpuNode]]] = []
    if shares:
        spread = {nid: grown(nodes[nid], left * frac) for nid, frac in shares.items()}
        options.append((min(slack(n) for n in spread.values()), spread))
    memory = prof.memory(acc.max_batch(prof, s.slo_ms, s.session_id))
    seed = SessionPlacement(s.session_id, s.model, s.slo_ms, prof.batches[0], 0.0, 0.0, 0.0)
    for n in nodes.values():
        if n.node_id in shares:
            continue
        if _hosts(n, s.session_id):
            trial = grown(n, left)
        elif n.memory_bytes + memory <= memory_limit:
            trial = _with(n, _rerouted(seed, left, n.duty_cycle_ms, prof, acc, prof.batches[0]), memory)
        else:
            continue
        options.append((slack(trial), {n.node_id: trial}))
    if not options:
        return False
    nodes.update(max(options, key=lambda o: o[0])[1])
    return True


def _demand_ms(acc: Accounting, prof: BatchProfile, duty_ms: float, rate: float) -> float:
    """GPU time per duty cycle to serve ``rate`` req/s: ℓ(⌈d·r⌉), beyond the largest profiled batch pro rata."""
    b = ceil_batch(duty_ms * rate / 1000.0)
    if b <= prof.max_batch:
        return acc.latency(prof, b) if b > 0 else 0.0
    return acc.latency(prof, prof.max_batch) * b / prof.max_batch


def _take(n: GpuNode, s: Session, prof: BatchProfile, acc: Accounting, cap: int, left: float,
          memory_room: int) -> tuple[float, SessionPlacement | None]:
    """Most of ``left`` req/s node ``n`` can add for ``s`` keeping Σℓ ≤ d, d + ℓ(b) ≤ SLO, b ≤ B and memory."""
    own = next((p for p in n.placements if p.session_id == s.session_id), None)
    if own is None and n.memory_bytes > memory_room:
        return 0.0, None
    d, have = n.duty_cycle_ms, own.rate if own else 0.0
    floor = own.batch if own else prof.batches[0]
    room = d - (n.busy_ms - (own.latency_ms if own else 0.0))

    def ok(b: int) -> bool:
        return b <= cap and fits(acc.latency(prof, b), room) and fits(acc.worst_case(prof, d, b), s.slo_ms)

    if ok(max(floor, ceil_batch(d * (have + left) / 1000.0))):
        x = left
    else:
        good = [b for b in prof.batches if b >= floor and ok(b)]
        x = min(left, max(good) * 1000.0 / d - have) if good else 0.0
    if x <= _TOL * left:
        return 0.0, None
    seed = own or SessionPlacement(s.session_id, s.model, s.slo_ms, floor, 0.0, 0.0, 0.0)
    return x, _rerouted(seed, have + x, d, prof, acc, floor)


def _hosts(n: GpuNode, sid: str) -> bool:
    return any(p.session_id == sid for p in n.placements)


def _with(n: GpuNode, p: SessionPlacement, memory: int) -> GpuNode:
    """``n`` hosting one more session ``p`` that needs ``memory`` bytes."""
    return replace(n, placements=n.placements + (p,), saturated=False, memory_bytes=n.memory_bytes + memory)


def _rerouted(p: SessionPlacement, rate: float, duty_ms: float, prof: BatchProfile, acc: Accounting, floor: int
              ) -> SessionPlacement:
    """``p`` at ``rate`` on a node of duty ``duty_ms``: batch ⌈d·r⌉ within the SLO-feasible ones, ≥ ``floor``."""
    cap = acc.max_batch(prof, p.slo_ms, p.session_id)
    feasible = [b for b in prof.batches if b <= cap and fits(acc.worst_case(prof, duty_ms, b), p.slo_ms)]
    b = max(floor, min(ceil_batch(duty_ms * rate / 1000.0), max(feasible, default=cap)))
    lat = acc.latency(prof, b)
    return replace(p, batch=b, rate=rate, latency_ms=lat, worst_case_ms=acc.worst_case(prof, duty_ms, b))
