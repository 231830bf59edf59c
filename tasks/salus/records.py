"""Salus's records of the sharing flow (``flows.gpu_sharing``): per policy an MLflow run nested under the flow's run
with its measured Table 2.1 metrics beside the simulator's (``sim_<metric>``) and every job's iteration spans
(``jobs.json``), its Prefect table ``salus-jobs-<policy>`` and its lane chart ``salus-lanes-<policy>``; then the
table ``salus-policies`` comparing the policies. Published through ``tasks.report.records``.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Sequence

from tasks.report.records import Records
from tasks.salus.charts import lanes_png
from tasks.salus.outcomes import PolicyOutcome

log = logging.getLogger(__name__)

ACCOUNTING_ONLY = ("lanes are accounting only: a simulated device, the jobs run on the CPU (tokens and policies are "
                   "real)")
SIM_NOTE = ("sim_* / sim: gpu.sim.salus's prediction for the same jobs from each one's iteration time measured at its "
            "least contended; it leaves out all a job does outside its iterations (worker start, torch import, model "
            "and data set-up) and, on a simulated device, that the jobs share this machine's few CPU cores, so the "
            "measured times can be tens of times larger: compare policies with each other, each column with itself")


def _slug(policy: str) -> str:
    return policy.replace("_", "-")


def lane_chart(outcome: PolicyOutcome) -> Path | None:
    """The policy's lane Gantt PNG (``tasks.salus.charts.lanes_png``), None when it could not be drawn."""
    title = (f"Salus {outcome.policy}: makespan {outcome.summary['makespan_s']:.2f} s, average JCT "
             f"{outcome.summary['avg_jct_s']:.2f} s, at most {int(outcome.summary['peak_lanes'])} lane(s) at once"
             + ("\nlanes are accounting only (simulated device)" if outcome.simulated_device else ""))
    try:
        return lanes_png(outcome.jobs, Path(tempfile.mkdtemp(prefix="gpuflows-chart-"))
                         / f"salus-lanes-{outcome.policy}.png", title=title)
    except Exception as exc:  # noqa: BLE001 - a chart never fails the flow
        log.warning("could not draw the lane chart of %s: %r", outcome.policy, exc)
        return None


def log_policy_run(records: Records, outcome: PolicyOutcome, sim: dict[str, float]) -> str | None:
    """One MLflow run nested under the flow's run for the policy: its measured metrics, the simulator's
    (``sim_<metric>``) and the per-job rows with their iteration spans (``jobs.json``); returns the run id."""
    run = records.nested(f"salus-{outcome.policy}", {"policy": outcome.policy,
                                                       "simulated_device": str(outcome.simulated_device).lower()})
    records.log(run, metrics={**outcome.summary, **{f"sim_{k}": v for k, v in sim.items()}}, params={
        "policy": outcome.policy, "jobs": len(outcome.jobs), "device_mb": f"{outcome.device_mb:g}"})
    records.json(run, outcome.jobs, "jobs.json")
    records.finish(run)
    return run


def publish_policy(records: Records, outcome: PolicyOutcome, sim: dict[str, float]) -> None:
    """The policy's MLflow run, its Prefect table (one row per job) and its lane chart, in both places."""
    run = None
    with records.kept(f"MLflow run of policy {outcome.policy} not logged"):
        run = log_policy_run(records, outcome, sim)
    table = [{k: v for k, v in r.items() if k not in ("spans", "span_lanes")} for r in outcome.jobs]
    records.table(f"salus-jobs-{_slug(outcome.policy)}", table,
                  f"Salus {outcome.policy}: one row per job (seconds since the first arrival)"
                  + (f"; {ACCOUNTING_ONLY}" if outcome.simulated_device else ""), run)
    records.chart(lane_chart(outcome), f"salus-lanes-{_slug(outcome.policy)}", f"Salus {outcome.policy}: lanes",
                  "One row per job: grey = queued, a bar per iteration coloured by its lane.", run)


def publish_comparison(records: Records, comparison: Sequence[dict[str, Any]], note: str) -> None:
    """The table ``salus-policies``: each policy measured beside the simulator's prediction for the same jobs."""
    records.table("salus-policies", comparison, "Salus: each policy on the same trace, measured beside the "
                  f"simulator's prediction for the same jobs. {SIM_NOTE}" + (f"; {note}" if note else ""))
