"""The FLUID TrialGroups flow: real digit-MLP trials on a simulated pool, MLflow read back, resizes, failures.

Two flow runs are shared by every assertion (module-scoped fixtures, one MLflow database): a 3-config grid on 2
simulated GPUs with an explicit c = 2 and one injected failure, and a Hyperband search whose promoted trial runs 2
GPUs wide and whose c comes from a tiny packing measurement at start-up. The other tuning algorithms drive the
same session/executor pair at engine level (no Prefect) below.
"""

from __future__ import annotations

import pytest

from flows.trial_groups import SEARCHES, main, make_algorithm, trial_groups
from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import FluidParams, fit_packing_curve, save_packing_curve
from gpu.schedulers.fluid.controller import FluidExecutor
from gpu.schedulers.fluid.session import TuningSession
from resource_blocks import MlflowTarget

pytestmark = pytest.mark.usefixtures("prefect_server")

GRID = {"lr": {"grid": [0.05, 0.1, 0.2]}, "hidden": 32, "batch_size": 64}
FAILING = "c0001@0"


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow database for the module's tracked runs (each its own experiment): migrated once."""
    return f"sqlite:///{tmp_path_factory.mktemp('tg-mlflow')}/mlflow.db"


@pytest.fixture(scope="module")
def grid(prefect_server, state_folder, sim_pool, mlflow_uri):
    """3 configs x 4 iterations, one chunk per iteration, c = 2, alpha = 1.5; the second config fails."""
    target = MlflowTarget(tracking_uri=mlflow_uri, experiment="tg-test")
    with state_folder("tg-grid"):
        s = trial_groups(algorithm="grid", space=GRID, iterations=4, chunk=1, c=2, d=1, alpha=1.5,
                         pool=sim_pool("tg-grid"), mode="thread", tracking=target, fail_trial=FAILING,
                         model_name="tg-grid-best", progress=False)
        leases = sim_pool("tg-grid").open_ledger().leases()
    from mlflow import MlflowClient

    return s, MlflowClient(target.resolved_uri()), leases


@pytest.fixture(scope="module")
def hyperband(prefect_server, state_folder, sim_pool, mlflow_uri):
    """Hyperband (eta 3, budgets 1 and 3) on 2 GPUs with d = 2: the promoted trial starts alone, 2 GPUs wide.

    c = None: a tiny packing measurement (p = 1..4 x 60 iterations) on simulated device 0 sets c and alpha
    (the assertions on the wide trial hold for any c: each rung is a group of its own).
    """
    target = MlflowTarget(tracking_uri=mlflow_uri, experiment="tg-hyperband")
    with state_folder("tg-hb"):
        s = trial_groups(algorithm="hyperband", iterations=3, min_iterations=1, chunk=1, c=None, d=2,
                         packing_iterations=60, pool=sim_pool("tg-hb"), mode="thread", tracking=target,
                         model_name="tg-hb-best", progress=False)
    from mlflow import MlflowClient

    return s, MlflowClient(target.resolved_uri())


def test_every_chunk_runs_on_the_gpus_fluid_chose(grid, hyperband):
    """The runner's placement read back inside the task equals FLUID's decision (Request.devices), resizes too."""
    for s in (grid[0], hyperband[0]):
        chunks = [c for trial in s["placements"].values() for c in trial]
        assert chunks and all(c["devices"] == c["fluid_devices"] for c in chunks), s["placements"]
    assert any(len(c["devices"]) == 2 for t in hyperband[0]["placements"].values() for c in t)


def test_c_is_derived_from_a_packing_curve_measured_at_start_and_logged(hyperband):
    s, client = hyperband
    curve = s["packing_curve"]
    assert s["c_source"].startswith("measured") and curve["ps"] == [1, 2, 3, 4]
    refit = fit_packing_curve(curve["ps"], curve["iters_per_s"])
    assert s["c"] == refit.c == curve["c"] and s["alpha"] == pytest.approx(refit.alpha)
    widths = [c["width"] for t in s["placements"].values() for c in t]
    assert min(widths) == 1.0 / s["c"] and all(w == 1.0 / s["c"] or w >= 1 for w in widths), (s["c"], widths)
    parent = client.get_run(s["mlflow_run_id"]).data
    assert parent.params["fluid.c"] == str(s["c"]) and parent.params["fluid.c_source"] == s["c_source"]
    assert float(parent.params["fluid.alpha"]) == pytest.approx(refit.alpha, rel=1e-3)
    history = client.get_metric_history(s["mlflow_run_id"], "packing_iters_per_s")
    assert [(m.step, m.value) for m in history] == list(zip(curve["ps"], curve["iters_per_s"]))


def test_a_saved_packing_curve_is_used_without_measuring(state_dir):
    """The benchmark's saved curve for the device wins (returned before submitting a task)."""
    from tasks.fluid.profiling import saved_or_measured_curve

    saved = fit_packing_curve([1, 2, 3], [100.0, 190.0, 200.0])
    save_packing_curve(saved, "NVIDIA Test GPU", iterations=2000)
    curve, source = saved_or_measured_curve("NVIDIA Test GPU", 0, iterations=1)
    assert curve == saved and "packing-nvidia-test-gpu.json" in source


def test_search_logs_a_child_run_per_trial_with_params_metrics_and_placement(grid):
    s, client, _ = grid
    parent = client.get_run(s["mlflow_run_id"])
    assert s["mlflow_errors"] == []  # every record reached MLflow
    assert set(s["trial_runs"]) == {"c0000@0", FAILING, "c0002@0"}
    for tid, rid in s["trial_runs"].items():
        run = client.get_run(rid)
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params["lr"] in ("0.05", "0.1", "0.2") and run.data.params["budget"] == "4.0"
        assert "placement.0000" in run.data.tags, run.data.tags
        if tid == FAILING:
            assert run.info.status == "FAILED" and "injected failure" in run.data.tags["error"]
            continue
        assert run.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(rid, "loss")] == [1, 2, 3, 4]
        assert len(client.get_metric_history(rid, "val_accuracy")) == 4
        assert len(client.get_metric_history(rid, "gpu_fraction")) == 4


def test_best_model_is_registered_from_the_best_finished_trial(grid):
    s, client, _ = grid
    assert s["best_trial"] != FAILING and s["best_val_accuracy"] > 0.8
    assert s["best_val_accuracy"] == pytest.approx(1 - min(v for k, v in s["scores"].items() if k != FAILING))
    versions = client.search_model_versions("name='tg-grid-best'")
    assert [v.run_id for v in versions] == [s["trial_runs"][s["best_trial"]]]


def test_the_prefect_ui_lists_every_trial_with_its_result_and_gpu_widths(grid, table_artifacts):
    s = grid[0]
    table = next(t for t in table_artifacts("fluid-trials-grid") if any(r["trial"] == FAILING for r in t))
    assert {r["trial"] for r in table} == set(s["scores"])
    failed = next(r for r in table if r["trial"] == FAILING)
    assert failed["failed"] and failed["val_accuracy"] is None
    best = next(r for r in table if r["best"])
    assert best["trial"] == s["best_trial"] and best["val_accuracy"] == pytest.approx(s["best_val_accuracy"], rel=1e-3)
    assert all(r["gpu_widths"] for r in table if not r["failed"])


def test_trials_share_one_device_as_fractional_slices(grid):
    """Three 0.5 slices on two devices at once: two trials hold halves of the same device (read from MLflow)."""
    s, client, _ = grid
    first = {}
    for tid, rid in s["trial_runs"].items():
        tag = dict(kv.split("=") for kv in client.get_run(rid).data.tags["placement.0000"].split())
        assert float(tag["fraction"]) == 0.5 and tag["data_parallel"] == "1"
        first.setdefault(tag["devices"], []).append(tid)
    assert max(len(tids) for tids in first.values()) >= 2, first


def test_dynamic_fluid_widens_a_trial_at_a_chunk_boundary_and_training_continues(grid):
    """When the failed trial frees its half, DynamicFluid (alpha 1.5) moves a neighbour to a whole device."""
    s, _, _ = grid
    resized = [t for t, chunks in s["placements"].items() if chunks[0]["width"] == 0.5 and chunks[-1]["width"] == 1]
    assert resized, s["widths"]
    chunks = s["placements"][resized[0]]
    after = next(i for i, c in enumerate(chunks) if c["width"] == 1)
    assert chunks[after]["fraction"] == 1.0 and chunks[after]["start"] == after  # the runner granted the width
    losses = [c["loss"][0] for c in chunks]
    assert losses[after] < 0.5 * losses[0], losses  # resumed from the checkpoint, not restarted


def test_failed_trial_is_recorded_and_leaks_no_slice(grid):
    s, _, leases = grid
    assert s["failures"] == [FAILING] and s["scores"][FAILING] == 1.0
    assert "injected failure" in s["errors"][FAILING]
    assert s["trials"] == 3 and leases == []


def test_hyperband_promotes_from_a_checkpoint_to_a_wide_trial_that_says_it_ran_on_one_device(hyperband):
    s, _ = hyperband
    wide = [t for t, chunks in s["placements"].items() if chunks[0]["width"] == 2]
    assert wide, s["widths"]
    promoted = next(t for t in wide if t.endswith(".1"))
    chunk = s["placements"][promoted][0]
    assert len(chunk["devices"]) == 2 and chunk["data_parallel"] == 1  # simulated pool: no CUDA devices
    parent = s["placements"][promoted.replace(".1", ".0")]
    assert chunk["start"] == 1 and chunk["loss"][0] < parent[0]["loss"][0]  # continues its rung-0 checkpoint
    assert s["failures"] == [] and s["iterations_trained"] == 3 * 1 + 2 + 2 * 3  # bracket 1: 3 configs, 1 promoted


@pytest.mark.parametrize("device, visible, gpus, cuda_count, ids", [
    ("cuda:0", "2,3", (2, 3), 2, [0, 1]),   # process mode: CUDA_VISIBLE_DEVICES renumbers the trial's GPUs
    ("cuda:2", "", (2, 3), 4, [2, 3]),      # thread mode: every GPU visible, pool indices are torch ids
    ("cuda:2", "", (2, 3), 3, []),          # torch sees fewer GPUs than the placement: one device
    ("cpu", "", (0, 1), 0, []),             # simulated pool
    ("cuda:0", "0", (0,), 1, []),           # not wide
])
def test_wide_trials_go_data_parallel_only_on_gpus_torch_sees(monkeypatch, device, visible, gpus, cuda_count, ids):
    import types

    import torch

    from tasks.fluid.trials import data_parallel_ids

    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_count)
    placed = types.SimpleNamespace(device=device, visible_devices=visible, gpu_indices=gpus)
    assert data_parallel_ids(placed) == ids


@pytest.mark.parametrize("algorithm", SEARCHES)
def test_every_tuning_algorithm_drives_a_fluid_session(algorithm):
    """Each algorithm the flow offers hands out TrialGroups that FluidExecutor places within c and d to the end."""
    algo = make_algorithm(algorithm, trials=4, iterations=4, seed=0, space=None, min_iterations=1, generations=2)
    session = TuningSession(algo, FluidExecutor([0, 1], FluidParams(c=2, d=2)))
    running, seen, step = {}, set(), session.start()
    while True:
        for p in step.starts + step.resizes:
            assert (p.width <= 0.5 and len(p.gpus) == 1) or (p.width == len(p.gpus) <= 2), p
            running[p.trial_id] = p
        loads = {}
        for p in running.values():
            for g in p.gpus:
                loads[g] = loads.get(g, 0) + min(p.width, 1.0)
        assert all(v <= 1 + 1e-9 for v in loads.values()), running
        if not running:
            break
        tid = sorted(running)[0]
        del running[tid]
        seen.add(tid)
        trial = session.trial(tid)
        assert trial.checkpoint is None or trial.checkpoint in seen
        step = session.report_complete(0.0, tid, 1.0 / (1 + trial.resume_from + trial.budget))
    assert session.finished and seen == {r.trial_id for r in algo.results}
    assert max(r.iterations for r in algo.results) <= 4
    resumed = [t for t in seen if session.trial(t).checkpoint]
    assert bool(resumed) == (algorithm not in ("grid", "random")), resumed  # promotions / exploits continue


@pytest.mark.parametrize("kwargs, field, shown", [
    ({"space": {}}, "space", "{}"),
    ({"iterations": 0}, "iterations", "0"),
    ({"trials": -1, "algorithm": "random"}, "trials", "-1"),
    ({"c": 0}, "c", "0"),
    ({"d": 0}, "d", "0"),
    ({"alpha": 0.5}, "alpha", "0.5"),
    ({"chunk": 0}, "chunk", "0"),
    ({"packing_iterations": 0}, "packing_iterations", "0"),
    ({"algorithm": "annealing"}, "algorithm", "annealing"),
    ({"execution": "gang"}, "execution", "gang"),
])
def test_bad_input_names_the_field_and_value(kwargs, field, shown, sim_pool):
    """Validated before any flow run or lease (``.fn``: the flow body without a Prefect run)."""
    with pytest.raises(ConfigError) as err:
        trial_groups.fn(pool=sim_pool("tg-bad"), mode="thread", tracking=False, progress=False, **kwargs)
    assert err.value.field == field and shown in str(err.value)


def test_cli_help_and_bad_algorithm(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "--algorithm" in capsys.readouterr().out
    assert main(["--algorithm", "nope", "--no-tracking"]) == 2
    assert "nope" in capsys.readouterr().err
