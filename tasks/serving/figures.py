"""The serving rollout's figures, from what its runtime recorded: per beacon, per planner epoch, per query.

Nexus (Shen et al., SOSP'19) reports throughput within the SLO and the bad rate per epoch (§7); a query served
as a DAG is bad when any of its stages is (Nexus §6.2's unit), and Nona (Pit-Claudel et al., §IV) reports a
query's job completion time (JCT: its last stage's finish − its root's arrival). ``summarise`` turns the
runtime's recorder, the load generator's report and the planner's epoch marks into the rollout's result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.schedulers.nexus.squishy import Plan
from tasks.serving.spec import ServingSpec


@dataclass(frozen=True)
class EpochMark:
    """An epoch of the planner: when it ran, the plan in force after it, and whether it changed the plan."""

    t_s: float
    plan: Plan
    replanned: bool


def summarise(sp: ServingSpec, rt, load, marks: list[EpochMark], beacons: list[dict],
              profiles: Mapping[str, BatchProfile]) -> dict[str, Any]:
    """The rollout's result: per beacon (its rows in ``beacons`` gain the window's offered, good and bad rates), per
    planner epoch (plan and SLO figures), over the run, per query, and the dispatch overhead."""
    t0 = load.start_ms
    rec = rt.recorder
    for b in beacons:
        w = rec.window(t0 + (b["t_s"] - sp.epoch.beacon_s) * 1000, t0 + b["t_s"] * 1000)
        b.update(offered_rps=w.offered_rps, throughput_rps=w.throughput_rps, bad_rate=w.bad_rate)
    epochs = []
    for i, m in enumerate(marks):
        end = marks[i + 1].t_s if i + 1 < len(marks) else sp.duration_s
        w = rec.window(t0 + m.t_s * 1000, t0 + end * 1000, labels=load.labels)
        epochs.append({"epoch": i, "start_s": m.t_s, "end_s": end, "replanned": m.replanned,
                       "gpus": m.plan.num_gpus, "unassigned_rps": sum(r for _, r in m.plan.unassigned),
                       "plan": m.plan.to_dict(), **w.metrics()})
    total = rec.window(labels=load.labels)
    overhead = rt.overhead()
    batch1_us = min(p.latency(1) for p in profiles.values()) * 1000
    queries = query_figures(sp, rt)
    served = sum(q["queries"] for q in queries.values())
    return {"spec": sp.name, "batch_policy": sp.batch_policy, "duration_s": sp.duration_s, "requests": load.sent,
            "epochs": epochs, "max_gpus": max(e["gpus"] for e in epochs), "replans": sum(m.replanned for m in marks[1:]),
            **total.metrics(), **overhead, "smallest_batch1_us": batch1_us,
            "dispatch_overhead_frac_of_batch1": overhead["dispatch_overhead_us"] / batch1_us,
            "loadgen_max_lag_ms": load.max_lag_ms, "queries": queries, "placement": sp.placement,
            **handoff_figures(rt),
            **({"query_bad_rate": sum(q["queries"] * q["bad_rate"] for q in queries.values()) / served}
               if served else {})}


def handoff_figures(rt) -> dict[str, float]:
    """Hand-offs between query stages, those that crossed nodes, and the link's load and wait."""
    fe = rt.frontend
    out = {"handoffs": float(fe.handoffs), "cross_node_handoffs": float(fe.cross_node),
           "cross_node_share": fe.cross_node / fe.handoffs if fe.handoffs else 0.0}
    if rt.link is not None:
        out.update(link_transfers=float(rt.link.transfers),
                   link_mean_wait_ms=rt.link.wait_ns / max(1, rt.link.transfers) / 1e6,
                   link_busy_s=rt.link.busy_ns / 1e9)
    return out


def query_jct(outcomes, root_session: str, stages: set[str], root) -> np.ndarray:
    """Job completion time (ms) of every query whose requests all finished: last finish − root arrival."""
    arrival: dict[int, float] = {}
    last: dict[int, float] = {}
    lost: set[int] = set()
    for o in outcomes:
        if o.session_id == root_session:
            q = o.request_id
            arrival[q] = o.arrival_ms
        elif o.session_id in stages:
            q = root(o.request_id)
        else:
            continue
        if not np.isfinite(o.finish_ms):
            lost.add(q)
        else:
            last[q] = max(last.get(q, -np.inf), o.finish_ms)
    return np.array([last[q] - a for q, a in arrival.items() if q in last and q not in lost])


def query_figures(sp, rt) -> dict[str, dict[str, float]]:
    """Per query served as a DAG: how many (root requests) and the share that were bad (Nexus §7's unit)."""
    from tasks.serving.chaining import query_bad_rate

    out: dict[str, dict[str, float]] = {}
    if not rt.chainer.parents:
        return out
    outcomes = rt.recorder.outcomes
    for q in sp.queries:
        stages = [f"{q.query_id}/{st.name}" for st in q.stages if st.parent is not None]
        if stages:
            n, bad = query_bad_rate(outcomes, f"{q.query_id}/{q.root}", stages, rt.chainer.root)
            jct = query_jct(outcomes, f"{q.query_id}/{q.root}", set(stages), rt.chainer.root)
            out[q.query_id] = {"queries": n, "bad_rate": bad,
                               "mean_jct_ms": float(jct.mean()) if len(jct) else float("nan"),
                               "p99_jct_ms": float(np.percentile(jct, 99)) if len(jct) else float("nan")}
    return out
