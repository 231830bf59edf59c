"""One Cilantro flow run's rounds in the flow's world: run every job on its slice, feed the measured
reports to the round controller, keep the state, log each round to MLflow (thesis §3.3 Fig. 3.3, §3.4;
the records: ``tasks.cilantro.records``).

``flows.allocation_rounds`` validates the input and calls ``run_rounds``; the decisions are
``gpu.schedulers.cilantro.controller.CilantroRound``'s, the same controller the simulator drives.
"""

from __future__ import annotations

import time
from pathlib import Path

from tasks.cilantro.allocator import (RoundSettings, load_state, open_book, report_of, round_metrics, save_state,
                                      state_path)
from tasks.cilantro.jobs import RoundWindow, run_service, run_trainer
from tasks.cilantro.records import log_unlogged, publish_rounds, round_record
from tasks.report.occupancy import publish_pool_occupancy
from tasks.report.progress import FlowProgress
from tasks.report.records import Records
from tasks.runtime.requests import gpu_options
from tasks.runtime.tracking import flow_tracker


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
    publish_rounds(Records(s.tracking_uri, parent), s.run_name, s.policy, rows)
    publish_pool_occupancy()
    return {"run_name": s.run_name, "policy": s.policy, "start_round": start, "next_round": ctl.next_round,
            "resumed": s.resume and saved is not None, "rounds": rows, "state_path": str(state_path(s.run_name)),
            "mlflow_run_id": parent, "mlflow_errors": errors + (tracker.flush() if tracker else [])}
