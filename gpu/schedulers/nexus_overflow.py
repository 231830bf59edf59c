"""Route a capped plan's unassigned load onto its GPUs: admission is the dispatcher's job, not the plan's.

Nexus §5–6: the frontend sends *every* request of a session to one of the session's backends by the routing
table, and the backends' early-drop dispatch (§6.3) absorbs overload by dropping what cannot meet its
deadline. A capped squishy plan (``SquishyPacker.plan(max_gpus=...)``) lists in ``Plan.unassigned`` the rate it
could not place within its worst-case promise (duty + ℓ(b) ≤ SLO); that load still arrives. This module turns
the capped plan into the plan the cluster actually runs (spec §8 target 2, inferred):

* a session that has GPUs gets its unassigned rate on those GPUs in proportion to its planned shares (the
  routing table ``Plan.rate_shares()`` is unchanged);
* a session with no GPU at all goes, whole, onto the GPU with the most duty-cycle headroom ``d − Σℓ(b)``
  (updated as sessions are added) among those where its model fits in memory at its max batch, as a merge
  requires; where it fits nowhere it stays in ``unassigned`` and the frontend drops it;
* each touched placement runs the batch its duty cycle collects at the routed rate, ``⌈d·r⌉``, but no more
  than the largest batch whose worst case ``d + ℓ(b)`` meets the SLO (the MERGENODES rule), and never
  less than its planned batch.

The result keeps every node's duty cycle, so ``Plan.violations()`` shows where occupancy now exceeds it:
the routed plan promises nothing for the overflow; the simulator measures what the dispatcher makes of it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from gpu.schedulers.nexus import GpuNode, Placement, Plan, ceil_batch
from gpu.schedulers.nexus_profiles import PRESETS, TITAN_X_MEMORY_BYTES, Accounting, BatchProfile


def route_unassigned(plan: Plan, profiles: Mapping[str, BatchProfile], accounting: Accounting | None = None,
                     device_memory_bytes: int = TITAN_X_MEMORY_BYTES) -> Plan:
    """The plan with ``plan.unassigned`` routed onto GPUs (see the module docstring); its ``unassigned`` keeps
    only the sessions no GPU has memory for."""
    if not plan.unassigned or not plan.nodes:
        return plan
    acc = accounting or PRESETS[plan.preset]
    by_id = {s.session_id: s for s in plan.sessions}
    shares = plan.rate_shares()
    extra: dict[tuple[int, str], float] = {}  # (node id, session id) → routed req/s on top of the plan
    homeless: list[tuple[str, float]] = []
    for sid, left in plan.unassigned:
        if sid in shares:
            for nid, frac in shares[sid].items():
                extra[(nid, sid)] = extra.get((nid, sid), 0.0) + left * frac
        else:
            homeless.append((sid, left))
    nodes = {n.node_id: n for n in plan.nodes}
    for (nid, sid), add in extra.items():
        n = nodes[nid]
        nodes[nid] = replace(n, placements=tuple(
            _rerouted(p, p.rate + add, n.duty_cycle_ms, profiles[p.model], acc, p.batch) if p.session_id == sid
            else p for p in n.placements))
    dropped = []
    for sid, rate in sorted(homeless, key=lambda x: -x[1]):
        s, prof = by_id[sid], profiles[by_id[sid].model]
        memory = prof.memory(acc.max_batch(prof, s.slo_ms, sid))
        fits = [n for n in nodes.values() if n.memory_bytes + memory <= device_memory_bytes]
        if not fits:
            dropped.append((sid, rate))
            continue
        n = max(fits, key=lambda n: (n.duty_cycle_ms - n.busy_ms, -n.node_id))
        seed = Placement(sid, s.model, s.slo_ms, prof.batches[0], 0.0, 0.0, 0.0)
        placed = _rerouted(seed, rate, n.duty_cycle_ms, prof, acc, prof.batches[0])
        nodes[n.node_id] = replace(n, placements=n.placements + (placed,), saturated=False,
                                   memory_bytes=n.memory_bytes + memory)
    return Plan(plan.strategy, plan.preset, tuple(nodes[n.node_id] for n in plan.nodes), plan.sessions,
                tuple(sorted(dropped)))


def _rerouted(p: Placement, rate: float, duty_ms: float, prof: BatchProfile, acc: Accounting, floor: int
              ) -> Placement:
    """``p`` at ``rate`` on a node of duty ``duty_ms``: batch ⌈d·r⌉ within the SLO-feasible ones, ≥ ``floor``."""
    cap = acc.max_batch(prof, p.slo_ms, p.session_id)
    feasible = [b for b in prof.batches if b <= cap and acc.worst_case(prof, duty_ms, b) <= p.slo_ms + 1e-6]
    b = max(floor, min(ceil_batch(duty_ms * rate / 1000.0), max(feasible, default=floor)))
    lat = acc.latency(prof, b)
    return replace(p, batch=b, rate=rate, latency_ms=lat, worst_case_ms=acc.worst_case(prof, duty_ms, b))
