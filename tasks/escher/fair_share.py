"""Hierarchical fair sharing on real tasks (Bhardwaj, ESCHER, thesis §4.4f, Fig. 4.5c): the ESL's shares are the
only thing that places the teams' jobs, and they follow the work as it runs. The flow is the world of the engine's
``FairShareMonitor``, the object the simulator drives too: every ``PERIOD_S`` of the wall clock it reports each
user's demand (its jobs not yet finished) and the nodes its jobs hold now (the ledger's leases), and applies the
``set_resource`` calls the monitor returns. A user whose jobs end hands its idle nodes on at the next period; a user
whose jobs run longer keeps its demand and so is handed those nodes."""

from __future__ import annotations

import time

from prefect.futures import wait

from gpu.schedulers.escher.api import Escher
from gpu.schedulers.escher.hfs import FairShareMonitor, HierarchicalFairShare, Rebalance
from tasks.escher.jobs import team_job
from tasks.runtime.requests import gpu_options

PERIOD_S = 0.2
"""The flow's rebalancing period (s): short beside a job (a job's SGD plus its task's start-up), as the simulator's
5 s is beside its 10 s tasks, so nodes a user leaves idle are handed on within a fraction of a job."""


def _holders(esl: Escher, users: list[str]) -> dict[str, set[str]]:
    """user -> the nodes its jobs hold now, read from the ledger's leases (a job requests ``res-<user>``)."""
    out: dict[str, set[str]] = {u: set() for u in users}
    for lease in esl.ledger.leases():
        for u in users:
            if f"res-{u}" in lease.resources:
                out[u].add(lease.node)
    return out


def run_hfs(esl: Escher, nodes: list[str], team_weights: tuple[float, float], jobs: int, steps: int) -> dict:
    """§4.4f: teams A (user a) and B (users b1, b2 of equal weight) share the nodes by ``team_weights``; every
    period the monitor re-divides them over the users' unfinished jobs until every job has ended, then takes
    every share back."""
    hfs = HierarchicalFairShare(list(nodes))
    team_a, team_b = (hfs.create_team(t, w) for t, w in zip(("team-a", "team-b"), team_weights))
    resources = {"a": team_a.create_user("a"), "b1": team_b.create_user("b1"), "b2": team_b.create_user("b2")}
    monitor = FairShareMonitor(hfs, PERIOD_S)
    start = time.monotonic()
    timeline: list[dict] = []

    def rebalance(demand: dict[str, int]) -> Rebalance:
        now = time.monotonic() - start
        decision = monitor.on_wake(now, demand, _holders(esl, list(resources)))
        esl.apply(decision.actions)
        timeline.append({"t": now, "demand": dict(demand), "shares": {u: list(n) for u, n in decision.shares.items()}})
        return decision

    left = {user: jobs for user in resources}
    first = rebalance(left)  # every job is queued: nodes' worth of demand each
    owner = {}
    for user, resource in resources.items():
        with gpu_options(gpus=1, resources={resource: 1}):
            owner.update({team_job.with_options(name=f"{user}-{i}").submit(user, i, steps): user for i in range(jobs)})
    pending, wake_at = list(owner), first.wake_at
    while pending:
        done, not_done = wait(pending, timeout=max(0.0, wake_at - (time.monotonic() - start)))
        for future in done:
            left[owner[future]] -= 1
        pending = list(not_done)
        if pending and time.monotonic() - start >= wake_at:
            wake_at = rebalance(left).wake_at
    rebalance({})  # no demand left: every share is given back
    rows = [f.result() for f in owner]
    peak = {u: max(len(row["shares"][u]) for row in timeline) for u in resources}
    return {"shares": {u: list(n) for u, n in first.shares.items()}, "timeline": timeline, "jobs": rows, "tasks": rows,
            "metrics": {**{f"share_{u}_nodes": len(n) for u, n in first.shares.items()},
                        **{f"peak_share_{u}_nodes": n for u, n in peak.items()}, "rebalances": len(timeline)}}
