"""Who a lease holder was: the flow run behind a ledger owner key (``host:pid:token``), for the occupancy chart.

A small SQLite registry (``<state dir>/pool_holders.db``): each flow run registers its ledger owner key under
its run name when it publishes its occupancy chart, so holders that published before are named; a holder still
running is named by the MLflow run its task runner opened (tags ``gpuflows.host``/``gpuflows.pid``, name = the
flow run's) when exactly one such run overlaps its leases, else shown by pid.
"""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any, Iterable

from gpu.liveness import HOST
from gpu.state import state_dir
from tasks.runtime.tracking import HOST_TAG, PID_TAG, open_client


def _registry() -> sqlite3.Connection:
    path = state_dir() / "pool_holders.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30)
    db.execute("CREATE TABLE IF NOT EXISTS holders (holder TEXT PRIMARY KEY, flow_run TEXT, pool TEXT, t REAL)")
    return db


def register_holder(holder: str, flow_run: str, pool: str) -> None:
    """Remember that ledger owner ``holder`` was flow run ``flow_run`` (for later charts of ``pool``)."""
    with _registry() as db:
        db.execute("INSERT OR REPLACE INTO holders VALUES (?,?,?,?)", (holder, flow_run, pool, time.time()))


def holder_names(holders: Iterable[str]) -> dict[str, str]:
    """Flow run names of the holders registered so far (others are absent)."""
    wanted = list(set(holders))
    if not wanted:
        return {}
    with _registry() as db:
        rows = db.execute(f"SELECT holder, flow_run FROM holders WHERE holder IN ({','.join('?' * len(wanted))})",
                          wanted).fetchall()
    return dict(rows)


def mlflow_holder_names(holders: Iterable[str], leases: list[dict[str, Any]], tracking_uri: str) -> dict[str, str]:
    """Names for holders on this host from the MLflow runs their task runners opened: a flow's parent run
    carries its process's host and pid (``tasks.runtime.tracking.holder_tags``) and is named like its flow run. A
    holder is named only when exactly one such run of its pid overlaps its leases."""
    client, out = open_client(tracking_uri), {}
    experiments = [e.experiment_id for e in client.search_experiments()]
    for holder in set(holders):
        host, _, rest = holder.partition(":")
        pid = rest.partition(":")[0]
        mine = [x for x in leases if x["holder"] == holder]
        if host != HOST or not pid.isdigit() or not mine or not experiments:
            continue
        lo, hi = min(x["start"] for x in mine) * 1000, max(x["end"] for x in mine) * 1000
        runs = client.search_runs(experiments, f"tags.`{HOST_TAG}` = '{HOST}' and tags.`{PID_TAG}` = '{pid}'",
                                  max_results=200)
        parents = {r.info.run_name for r in runs if "mlflow.parentRunId" not in r.data.tags
                   and r.info.start_time <= hi and (r.info.end_time or math.inf) >= lo}
        if len(parents) == 1:
            out[holder] = parents.pop()
    return out
