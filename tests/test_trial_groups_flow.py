"""The FLUID TrialGroups flow: real digit-MLP trials on a simulated pool, MLflow child runs, registry, failures."""

from __future__ import annotations

import pytest

from flows.trial_groups import main, trial_groups
from gpu.errors import ConfigError
from resource_blocks import GpuPool, MlflowTarget

pytestmark = pytest.mark.usefixtures("prefect_server")


def sim_pool(name: str) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="2x16GiB")


def test_grid_search_logs_child_runs_and_registers_the_best_model(state_dir):
    from mlflow import MlflowClient

    target = MlflowTarget(tracking_uri=f"sqlite:///{state_dir}/mlflow.db", experiment="tg-test")
    s = trial_groups(algorithm="grid", iterations=3, chunk=2, pool=sim_pool("tg-grid"), mode="thread",
                     tracking=target, model_name="tg-grid-best", progress=False)
    assert s["errors"] == {}, s["errors"]
    assert s["trials"] == 4 and s["failures"] == [] and s["iterations_trained"] == 12
    assert all(w < 1 for ws in s["widths"].values() for w in ws)  # 4 trials packed 2 per GPU
    assert s["best_val_accuracy"] > 0.8
    client = MlflowClient(target.resolved_uri())
    for tid, rid in s["trial_runs"].items():
        run = client.get_run(rid)
        assert run.data.tags["mlflow.parentRunId"] == s["mlflow_run_id"]
        assert {"lr", "hidden", "batch_size", "budget"} <= set(run.data.params)
        assert len(client.get_metric_history(rid, "val_accuracy")) == 3
        assert len(client.get_metric_history(rid, "loss")) == 3
        assert "devices" in run.data.tags and run.info.status == "FINISHED"
    versions = client.search_model_versions("name='tg-grid-best'")
    assert [v.run_id for v in versions] == [s["trial_runs"][s["best_trial"]]]


def test_failed_trial_is_recorded_and_leaks_no_slice(state_dir):
    pool = sim_pool("tg-fail")
    s = trial_groups(algorithm="grid", iterations=2, chunk=1, pool=pool, mode="thread", tracking=False,
                     fail_trial="c0001@0", progress=False)
    assert s["failures"] == ["c0001@0"] and s["scores"]["c0001@0"] == 1.0
    assert s["trials"] == 4 and s["best_trial"] != "c0001@0"
    assert GpuPool(name="tg-fail", device_backend="simulated").open_ledger().leases() == []


def test_asha_promotes_from_checkpoints_and_dynamic_fluid_resizes(state_dir):
    s = trial_groups(algorithm="asha", trials=4, iterations=3, min_iterations=1, pool=sim_pool("tg-asha"),
                     mode="thread", tracking=False, chunk=1, progress=False)
    promoted = [t for t in s["scores"] if not t.endswith("@0")]
    assert promoted, s["scores"]
    assert s["best_trial"] in promoted


@pytest.mark.parametrize("kwargs, field", [
    ({"space": {}}, "space"),
    ({"iterations": 0}, "iterations"),
    ({"algorithm": "annealing"}, "algorithm"),
    ({"execution": "gang"}, "execution"),
])
def test_bad_input_names_the_field(kwargs, field, state_dir):
    with pytest.raises(ConfigError) as err:
        trial_groups(pool=sim_pool("tg-bad"), mode="thread", tracking=False, progress=False, **kwargs)
    assert err.value.field.startswith(field)


def test_cli_help_and_bad_algorithm(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "--algorithm" in capsys.readouterr().out
    assert main(["--algorithm", "nope", "--no-tracking"]) == 2
