"""MLflow records of the ESCHER policies flow: a run per policy nested under the flow's run, with the ESL's lines of
code beside the paper's (Bhardwaj, ESCHER, thesis §4.5: "two lines of code to MapReduce, five lines to AlphaZero and
fifty lines to EscherTune"; Fig. 4.7: AppSpace 78, LibSpace 261, FrameSpace 1624 lines)."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from tasks.escher.demos import Demo


def esl_log(log_path: str, policy: str) -> list[dict]:
    """The ``set_resource`` calls a policy's ESL logged to ``log_path``, as rows of the flow's actions table."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as f:
        return [{"call": "set_resource", **{k: v for k, v in json.loads(line).items() if k != "spec"},
                 "by": f"{policy} ESL"}
                for line in f if line.strip()]


def log_policy_runs(results: Mapping[str, dict], demos: Mapping[str, Demo]) -> list[str]:
    """One MLflow run per policy, nested under the flow's run: each task's node (params ``node.<task>``), the
    ``set_resource`` log (artifact ``set_resource.json``), the ESL's lines beside the paper's, the policy's
    metrics. Returns the logging errors (a failing store costs the record, not the flow)."""
    from tasks.runtime.tracking import flow_tracker, holder_tags, open_client

    tracker = flow_tracker()
    parent = tracker.wait_parent() if tracker is not None else None
    if parent is None:
        return [] if tracker is None else ["the flow's MLflow run was never created: no policy run logged"]
    from mlflow.entities import Metric, Param, RunTag

    try:
        client = open_client(tracker.tracking_uri)
        experiment = client.get_run(parent).info.experiment_id
    except Exception as exc:  # noqa: BLE001 - any store error; kept for the flow's result
        return [f"no policy run logged to MLflow: {exc!r}"]
    errors = []
    now = int(time.time() * 1000)
    for name, out in results.items():
        demo = demos[name]
        try:
            run_id = client.create_run(experiment, run_name=demo.run_name, tags={
                "mlflow.parentRunId": parent, "escher.policy": name, **holder_tags()}).info.run_id
            params = [Param(f"node.{row['task']}", row["node"]) for row in out["tasks"]]
            params += [Param("esl", ", ".join(c.__name__ for c in demo.esl)), Param("paper_lines", demo.paper_lines or "-")]
            metrics = [Metric(k, float(v), now, 0) for k, v in out.get("metrics", {}).items()]
            metrics.append(Metric("esl_lines", out["esl_lines"], now, 0))
            for i in range(0, max(len(params), len(metrics)), 100):  # MLflow's batch limit
                client.log_batch(run_id, metrics=metrics[i:i + 100], params=params[i:i + 100],
                                 tags=[RunTag("escher.tasks", str(len(out["tasks"])))] if i == 0 else [])
            client.log_text(run_id, json.dumps(out["actions"], indent=1), "set_resource.json")
            client.set_terminated(run_id, "FINISHED")
        except Exception as exc:  # noqa: BLE001 - any store error; kept for the flow's result
            errors.append(f"policy {name} not logged to MLflow: {exc!r}")
    return errors
