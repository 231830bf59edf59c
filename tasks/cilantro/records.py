"""Cilantro's records of the allocation-rounds flow (``flows.allocation_rounds``): one MLflow run per round nested
under the flow's run (each job's allocation, load and performance bounds, measured performance and utility, the
round's welfare and fairness: thesis §3.4's metrics, Eq. 3.3-3.5), saved with the round's state before it is
logged, so a flow killed in between logs it once on resume; then the Prefect table ``cilantro-rounds-<run>`` and
the chart ``cilantro-rounds-chart-<run>``. Published through ``tasks.report.records``.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any

import numpy as np
from prefect import get_run_logger

from tasks.cilantro.allocator import RoundBook, RoundSettings
from tasks.cilantro.charts import rounds_png
from tasks.report.records import Records
from tasks.runtime.tracking import holder_tags


def round_record(s: RoundSettings, parent: str, row: dict, results: dict[str, dict | None]) -> dict:
    """What MLflow gets for one round, as plain JSON: saved with the state first, logged after (``log_round``)."""
    values = {}
    for name, a in row["allocation"].items():
        values[f"alloc_{name}"] = a
        values[f"load_ucb_{name}"] = row["load_ucb"][name]
        res = results.get(name)
        if res is not None:
            values[f"perf_{name}"] = float(np.mean(res["perf"]))
            values[f"load_{name}"] = float(np.mean(res["loads"]))
            values[f"throughput_{name}"] = res["throughput"]
            values[f"accuracy_{name}"] = res["accuracy"]
            values[f"work_ms_{name}"] = res["work_ms"]
        if name in row["demands"]:
            values[f"demand_{name}"] = row["demands"][name]
        values[f"perf_lcb_{name}"] = row["perf_lcb"][name]
        values[f"perf_ucb_{name}"] = row["perf_ucb"][name]
    values.update({f"utility_{n}": u for n, u in row["utilities"].items()})
    values.update({k: row[k] for k in ("social_welfare", "egalitarian_welfare", "njc_fairness") if k in row})
    values.update(decision_time_s=row["decision_s"], allocated_total=sum(row["allocation"].values()),
                  round_wall_s=row["wall_s"], failed_jobs=len(row["failed"]))
    params = {"capacity": s.capacity, "unit": s.unit, "round_s": s.round_s, "report_s": s.report_s,
              "max_change": s.max_change, "policy": s.policy}
    return {"id": uuid.uuid4().hex, "round": row["round"], "parent": parent, "experiment": s.experiment,
            "name": f"{s.run_name}-round-{row['round']}", "time": int(time.time() * 1000),
            "status": "FAILED" if row["failed"] else "FINISHED",
            "metrics": {k: float(v) for k, v in values.items() if math.isfinite(v)},
            "params": {k: str(v) for k, v in params.items()},
            "tags": {"cilantro.policy": s.policy, "cilantro.round": str(row["round"]), "round": str(row["round"]),
                     "cilantro.run_name": s.run_name,
                     "cilantro.failed": ",".join(row["failed"])}}


def log_round(records: Records, rec: dict) -> str:
    """Log one round record as a run nested under its flow's run (``records``: its experiment); returns the id.

    Idempotent: a run already tagged with the record's id (its process died after creating it, or after
    ending it but before the state forgot the record) is completed or kept, never duplicated; completing
    it makes this process its holder, so no sweeper takes it for the dead one's.
    """
    found = records.client.search_runs([records.experiment_id], f"tags.`cilantro.record` = '{rec['id']}'",
                                       max_results=1)
    if found and found[0].info.status in ("FINISHED", "FAILED"):
        return found[0].info.run_id
    run_id = found[0].info.run_id if found else records.nested(rec["name"], {"cilantro.record": rec["id"]},
                                                                 start_time=rec["time"])
    records.log(run_id, metrics=rec["metrics"], step=rec["round"], params=rec["params"],
                tags={**rec["tags"], **holder_tags()}, timestamp=rec["time"])
    records.finish(run_id, rec["status"])
    return run_id


def log_unlogged(s: RoundSettings, book: RoundBook) -> tuple[dict[int, str], list[str]]:
    """Log the saved round records not yet known to be in MLflow, oldest first: ``{round: run id}`` and errors.

    A logged record leaves ``book.unlogged`` (the next save drops it from the file); on a failure the
    rest stay there for the next flow run of this run_name, and the error is logged and returned.
    """
    logged: dict[int, str] = {}
    try:
        for rec in list(book.unlogged):
            logged[rec["round"]] = log_round(Records(s.tracking_uri, rec["parent"], rec["experiment"]), rec)
            book.unlogged.remove(rec)
    except Exception as exc:
        msg = (f"rounds {[r['round'] for r in book.unlogged]} not logged to MLflow yet, kept in the state "
               f"for the next run: {exc!r}")
        get_run_logger().error(msg)
        return logged, [msg]
    return logged, []


def publish_rounds(records: Records, run_name: str, policy: str, rows: list[dict[str, Any]]) -> None:
    """Cilantro's table (``cilantro-rounds-<run>``) and chart (``cilantro-rounds-chart-<run>``, also ``charts/``
    of the flow's MLflow run): allocation and utility per job per round."""
    records.table(f"cilantro-rounds-{run_name}", [
        {k: row[k] for k in ("round", "allocation", "utilities", "social_welfare", "egalitarian_welfare",
                             "njc_fairness", "decision_s", "failed") if k in row} for row in rows],
        f"Cilantro {policy}: GPU units allotted per job, the utilities they measured and the welfare/fairness "
        "of each round")
    try:
        png = rounds_png(rows, title=f"Cilantro {policy}, run {run_name}")
    except Exception as exc:  # noqa: BLE001 - a chart never fails the flow
        logging.getLogger(__name__).warning("could not draw Cilantro's rounds chart: %r", exc)
        return
    records.chart(png, f"cilantro-rounds-chart-{run_name.lower().replace('_', '-').replace('.', '-')}",
                  f"Cilantro {policy}: allocation and utility per job per round",
                  "Left: GPU units each job held per round; right: the utility it measured (x: its task failed).")
