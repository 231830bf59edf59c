"""One Cilantro flow run's rounds in the flow's world: run every job on its slice, feed the measured
reports to the round controller, keep the state, log each round to MLflow (thesis §3.3 Fig. 3.3, §3.4).

``flows.allocation_rounds`` validates the input and calls ``run_rounds``; the decisions are
``gpu.schedulers.cilantro.controller.CilantroRound``'s, the same controller the simulator drives.
"""

from __future__ import annotations

import math
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from prefect import get_run_logger

from tasks.cilantro.allocator import (RoundBook, RoundSettings, load_state, open_book, report_of, round_metrics,
                                      save_state, state_path)
from tasks.cilantro.jobs import RoundWindow, run_service, run_trainer
from tasks.report.charts import publish_pool_occupancy
from tasks.runtime.requests import gpu_options
from tasks.runtime.tracking import ensure_experiment, flow_tracker, holder_tags, open_client
from tasks.report.artifacts import FlowProgress, publish_cilantro_rounds


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


def log_round(client: Any, rec: dict) -> str:
    """Log one round record as a run nested under its flow's run; returns the run id.

    Idempotent: a run already tagged with the record's id (its process died after creating it, or after
    ending it but before the state forgot the record) is completed or kept, never duplicated; completing
    it makes this process its holder, so no sweeper takes it for the dead one's.
    """
    from mlflow.entities import Metric, Param, RunTag

    exp_id = ensure_experiment(client, rec["experiment"])
    found = client.search_runs([exp_id], f"tags.`cilantro.record` = '{rec['id']}'", max_results=1)
    if found and found[0].info.status in ("FINISHED", "FAILED"):
        return found[0].info.run_id
    run_id = found[0].info.run_id if found else client.create_run(
        exp_id, run_name=rec["name"], start_time=rec["time"],
        tags={"mlflow.parentRunId": rec["parent"], "cilantro.record": rec["id"], **holder_tags()}).info.run_id
    client.log_batch(run_id, metrics=[Metric(k, v, rec["time"], rec["round"]) for k, v in rec["metrics"].items()],
                     params=[Param(k, v) for k, v in rec["params"].items()],
                     tags=[RunTag(k, v) for k, v in {**rec["tags"], **holder_tags()}.items()])
    client.set_terminated(run_id, rec["status"])
    return run_id


def log_unlogged(s: RoundSettings, book: RoundBook) -> tuple[dict[int, str], list[str]]:
    """Log the saved round records not yet known to be in MLflow, oldest first: ``{round: run id}`` and errors.

    A logged record leaves ``book.unlogged`` (the next save drops it from the file); on a failure the
    rest stay there for the next flow run of this run_name, and the error is logged and returned.
    """
    logged: dict[int, str] = {}
    try:
        client = open_client(s.tracking_uri)
        for rec in list(book.unlogged):
            logged[rec["round"]] = log_round(client, rec)
            book.unlogged.remove(rec)
    except Exception as exc:
        msg = (f"rounds {[r['round'] for r in book.unlogged]} not logged to MLflow yet, kept in the state "
               f"for the next run: {exc!r}")
        get_run_logger().error(msg)
        return logged, [msg]
    return logged, []


def run_jobs(s: RoundSettings, alloc: dict[str, float], r: int, ckpt_dir: Path,
              checkpoints: dict[str, str | None]) -> tuple[dict[str, dict | None], dict[str, str | None]]:
    """Submit every job's round on a slice of its allocation; collect reports (None for a failed job)."""
    window = RoundWindow(r, s.round_s, s.report_s, s.capacity / len(s.jobs), s.trace_step, s.seed)
    futures, new_ckpt = {}, dict(checkpoints)
    for job in s.jobs:
        with gpu_options(gpus=alloc[job.name]):
            if job.kind == "service":
                t = run_service.with_options(name=f"cilantro-{job.name}", task_run_name=f"{job.name}-round-{r}")
                futures[job.name] = t.submit(job, window)
            else:
                new_ckpt[job.name] = str(ckpt_dir / f"{job.name}-round-{r}.pt")
                t = run_trainer.with_options(name=f"cilantro-{job.name}", task_run_name=f"{job.name}-round-{r}")
                futures[job.name] = t.submit(job, window, checkpoints[job.name], new_ckpt[job.name])
    results: dict[str, dict | None] = {}
    for name, fut in futures.items():
        fut.wait()
        ok = fut.state.is_completed()
        results[name] = fut.result() if ok else None
        if not ok:
            new_ckpt[name] = checkpoints[name]  # a failed trainer resumes from its last good checkpoint
    return results, new_ckpt


def run_rounds(s: RoundSettings, parent: str | None) -> dict:
    saved = load_state(s.run_name)
    book = open_book(s, saved)
    if saved and not s.resume:  # starting over still owes MLflow the saved run's unlogged rounds
        book.unlogged = saved.get("unlogged", [])
    tracker = flow_tracker()
    # a crashed run's rounds, now that the tracker marked that run's dead runs KILLED (the parent was awaited)
    errors = log_unlogged(s, book)[1] if s.tracking_uri and book.unlogged else []
    ckpt_dir = state_path(s.run_name).with_suffix("")
    ctl = book.ctl
    t0 = time.perf_counter()
    decision = ctl.planned or ctl.on_round(ctl.next_round * s.round_s, {})  # a resumed run applies the saved plan
    decision_s = time.perf_counter() - t0
    start, rows = decision.round_index, []
    progress = FlowProgress(f"cilantro-{s.run_name}", s.rounds, f"Cilantro {s.policy}", unit="rounds").start()
    for r in range(start, start + s.rounds):
        t0 = time.perf_counter()
        alloc = dict(decision.allocation)
        results, checkpoints = run_jobs(s, alloc, r, ckpt_dir, book.checkpoints)
        row = {"round": r, "allocation": alloc, "load_ucb": dict(decision.load_ucb),
               "perf_lcb": dict(decision.perf_lcb), "perf_ucb": dict(decision.perf_ucb),
               "demands": dict(decision.demands), "decision_s": decision_s,
               "failed": [n for n, v in results.items() if v is None],
               "held": {n: v["alloc"] for n, v in results.items() if v},
               "throughput": {n: v["throughput"] for n, v in results.items() if v},
               "work_ms": {n: v["work_ms"] for n, v in results.items() if v},
               **round_metrics(s, book.specs, results)}
        t1 = time.perf_counter()
        decision = ctl.on_round((r + 1) * s.round_s, {n: report_of(v) for n, v in results.items()})
        decision_s = time.perf_counter() - t1
        row["wall_s"] = time.perf_counter() - t0
        if parent is not None:
            book.unlogged.append(round_record(s, parent, row, results))
        stale = [p for n, p in book.checkpoints.items() if p and p != checkpoints[n]]
        book.checkpoints = checkpoints
        book.history.append({k: row[k] for k in ("round", "allocation", "utilities") if k in row})
        save_state(s.run_name, book.to_state())  # the round is kept from here on, its MLflow record too
        for p in stale:  # only once the state no longer points at them
            Path(p).unlink(missing_ok=True)
        logged, failed = log_unlogged(s, book) if book.unlogged and s.tracking_uri else ({}, [])
        row["mlflow_run_id"], errors = logged.get(r), errors + failed
        rows.append(row)
        progress.advance(note=f"round {r}" + (f", failed {','.join(row['failed'])}" if row["failed"] else ""))
    progress.close()
    publish_cilantro_rounds(s.run_name, s.policy, rows, parent, s.tracking_uri)
    publish_pool_occupancy()
    return {"run_name": s.run_name, "policy": s.policy, "start_round": start, "next_round": ctl.next_round,
            "resumed": s.resume and saved is not None, "rounds": rows, "state_path": str(state_path(s.run_name)),
            "mlflow_run_id": parent, "mlflow_errors": errors + (tracker.flush() if tracker else [])}
