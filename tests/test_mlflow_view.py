"""What a reviewer sees first in MLflow: each system's experiment says what to compare and offers a saved view of its
flow runs only (nested task runs filtered out), the headline metrics as the first columns, names in full."""

from __future__ import annotations

import json

from tasks.runtime.tracking import VIEW_ID, ExperimentView, publish_view


def test_an_experiment_opens_on_its_flow_runs_with_the_headline_metric_first(tmp_path):
    """About 55 nested runs per Ekya flow run pushed the flow runs behind "Load more", with no metric column: only
    Compare showed the outcome. The saved view's filter is MLflow's own search, so the store answers it here."""
    from mlflow import MlflowClient

    from flows.continuous_retraining import VIEW

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    eid = client.create_experiment("gpuflows-ekya")
    parents = set()
    for policy, accuracy in (("thief", 0.90), ("uniform", 0.86)):
        parent = client.create_run(eid, run_name=f"ekya-{policy}").info.run_id
        client.log_metric(parent, "mean_accuracy", accuracy)
        for window in range(3):
            client.create_run(eid, run_name=f"retrain cam0 w{window}", tags={"mlflow.parentRunId": parent})
        parents.add(parent)
    publish_view(client, eid, VIEW)
    tags = client.get_experiment(eid).tags
    envelope = json.loads(tags[f"mlflow.sharedViewState.{VIEW_ID}"])  # MLflow's saved-view envelope (under Views)
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert state["selectedColumns"][0] == "metrics.`mean_accuracy`" and "params.`policy`" in state["selectedColumns"]
    assert {r.info.run_id for r in client.search_runs([eid], state["searchFilter"])} == parents
    note = tags["mlflow.note.content"]
    assert "thief" in note and "`mean_accuracy`" in note and f"viewStateShareKey={VIEW_ID}" in note

    client.set_experiment_tag(eid, "mlflow.note.content", "my own notes")  # a description the user wrote stays
    publish_view(client, eid, ExperimentView("another text", ("mean_accuracy",)))
    assert client.get_experiment(eid).tags["mlflow.note.content"] == "my own notes"


def test_every_system_says_what_to_compare_on_metrics_its_flow_logs():
    import flows.allocation_rounds as cilantro
    import flows.continuous_retraining as ekya
    import flows.serving_rollout as serving
    import flows.trial_groups as fluid

    views = {"ekya": ekya.VIEW, "cilantro": cilantro.VIEW, "fluid": fluid.VIEW, **serving.VIEWS}
    assert set(serving.VIEWS) == {"nexus", "nona", "orloj"}
    outcomes = {"cilantro": set(cilantro._outcome([{"social_welfare": 1.0, "egalitarian_welfare": 1.0,
                                                      "njc_fairness": 1.0, "decision_s": 0.1, "failed": []}]))}
    for system, view in views.items():
        assert view.metrics and view.compare.lower().startswith(system), system
    assert set(cilantro.VIEW.metrics) <= outcomes["cilantro"]
