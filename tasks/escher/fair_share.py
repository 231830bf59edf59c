"""Hierarchical fair sharing on real tasks (Bhardwaj, ESCHER, thesis §4.4f): the ESL's shares, re-decided as jobs
end, are the only thing that places the teams' jobs."""

from __future__ import annotations

import time

from prefect.futures import as_completed

from gpu.schedulers.escher.api import Escher
from gpu.schedulers.escher.hfs import HierarchicalFairShare
from tasks.escher.jobs import team_job
from tasks.runtime.requests import gpu_options


def run_hfs(esl: Escher, nodes: list[str], team_weights: tuple[float, float], jobs: int, steps: int) -> dict:
    """§4.4f: teams A (user a) and B (users b1, b2 of equal weight) share the nodes by ``team_weights``."""
    hfs = HierarchicalFairShare(list(nodes))
    team_a, team_b = (hfs.create_team(t, w) for t, w in zip(("team-a", "team-b"), team_weights))
    resources = {"a": team_a.create_user("a"), "b1": team_b.create_user("b1"), "b2": team_b.create_user("b2")}
    esl.apply(hfs.on_round(0.0, {user: jobs for user in resources}))  # demand: nodes' worth of queued jobs
    shares = hfs.shares()
    users = {}
    for user, resource in resources.items():
        with gpu_options(gpus=1, resources={resource: 1}):
            users.update({team_job.with_options(name=f"{user}-{i}").submit(user, i, steps): user for i in range(jobs)})
    left, start = {user: jobs for user in resources}, time.time()
    for done in as_completed(list(users)):  # fewer nodes than users: one with work and no node gets some as others end
        left[users[done]] -= 1
        if any(n and not hfs.shares()[u] for u, n in left.items()):
            esl.apply(hfs.on_round(time.time() - start, left))
    esl.apply(hfs.on_round(time.time() - start, {}))  # no demand left: every share is given back
    rows = [f.result() for f in users]
    return {"shares": shares, "jobs": rows, "tasks": rows,
            "metrics": {f"share_{u}_nodes": len(n) for u, n in shares.items()}}
