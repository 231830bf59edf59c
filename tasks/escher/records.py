"""ESCHER's records of the policies flow (``flows.escher_policies``): a run per policy nested under the flow's run,
with the ESL's lines of code beside the paper's (Bhardwaj, ESCHER, thesis §4.5: "two lines of code to MapReduce,
five lines to AlphaZero and fifty lines to EscherTune"; Fig. 4.7: AppSpace 78, LibSpace 261, FrameSpace 1624
lines), and the Prefect table ``escher-actions`` of every call the ESLs made. Published through
``tasks.report.records``."""

from __future__ import annotations

from typing import Any, Mapping

from tasks.escher.demos import Demo
from tasks.report.records import Records
from tasks.runtime.tracking import flow_tracker


def publish_policies(results: Mapping[str, dict], demos: Mapping[str, Demo], actions: list[dict[str, Any]]
                     ) -> list[str]:
    """The table ``escher-actions`` and one MLflow run per policy, nested under the flow's run: each task's node
    (params ``node.<task>``), the ``set_resource`` log (artifact ``set_resource.json``), the ESL's lines beside
    the paper's, the policy's metrics. Returns the logging errors (a failing store costs the record, not the
    flow)."""
    records = Records.of_flow()
    records.table("escher-actions", actions, "ESCHER: every set_resource / lease_resource call the ESLs made")
    if not records.enabled:
        return [] if flow_tracker() is None else ["the flow's MLflow run was never created: no policy run logged"]
    for name, out in results.items():
        demo = demos[name]
        with records.kept(f"policy {name} not logged to MLflow"):
            run = records.nested(demo.run_name, {"escher.policy": name})
            records.log(run, params={**{f"node.{row['task']}": row["node"] for row in out["tasks"]},
                                     "esl": ", ".join(c.__name__ for c in demo.esl),
                                     "paper_lines": demo.paper_lines or "-"},
                        metrics={**out.get("metrics", {}), "esl_lines": out["esl_lines"]},
                        tags={"escher.tasks": len(out["tasks"])})
            records.json(run, out["actions"], "set_resource.json")
            records.finish(run)
    return records.errors
