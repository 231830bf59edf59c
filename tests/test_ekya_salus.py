"""Ekya's retraining and inference as co-located Salus jobs (``continuous_retraining --executor salus``):
real torch jobs sharing one lane get Ekya's split of its GPU time (token log), the flow produces its
accuracy results as with slices and records the lanes in MLflow, and a bad executor fails before any run."""

from __future__ import annotations

import re
import threading

import pytest

from gpu.errors import ConfigError
from resource_blocks import GpuPool, MlflowTarget
from tasks.ekya.salus import EkyaLanes, shared_span
from tasks.ekya.work import ConfigSpec, WindowSettings, infer_frames, infer_segment, retrain, small_net
from tasks.ekya.streams import make_streams, window_frames

TINY = dict(streams=2, windows=2, frames=300, labelled=200, mode="thread")


def _pool(name: str) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="2x16GiB")


def _model(settings: WindowSettings) -> dict:
    import torch

    torch.manual_seed(0)
    return dict(small_net(settings).state_dict())


def _first_window(spec, frames: int, labelled: int, epochs: int) -> tuple:
    """Camera ``spec``'s first window: its settings, starting model, labelled truth, a retraining config of
    ``epochs`` epochs, and Salus lanes on one 16 GiB device."""
    settings = WindowSettings(frames=frames, labelled=labelled)
    _, truth = window_frames(spec, 0, settings.labelled, "train")
    config = ConfigSpec(f"e{epochs}-all-d100", epochs, "all", 1.0)
    return settings, _model(settings), truth, config, EkyaLanes((16384.0,), settings)


def _colocate(lanes: EkyaLanes, jobs: dict[str, tuple[float, object]], together: bool = False) -> dict[str, object]:
    """Admit each job (name -> (weight, function of its lane)) into device 0's lane, run them side by side in
    threads, and let each leave its lane when it ends, as a finished task does.

    ``together``: a gate job holds the lane's token until every job has asked for its first iteration, so
    they compete from one instant. Without it, one job's start-up (data, model) can outlast the other's whole
    run on a busy machine, and the stretch where both compete is a handful of iterations."""
    executor = lanes.executor(0)
    from gpu.schedulers.salus.controller import Ask, SalusJob

    asked = threading.Semaphore(0)
    if together:
        executor.admit(SalusJob("gate", 1.0, 1.0, on_demand=True))
        executor.ask("gate")  # the gate holds the token while the jobs start
        on_arrival = executor.controller.on_arrival

        def counted(now: float, job: object) -> object:  # the controller has taken a job's first Ask
            step = on_arrival(now, job)
            if isinstance(job, Ask) and job.job_id != "gate":
                asked.release()
            return step

        executor.controller.on_arrival = counted
    admitted = {name: executor.admit(SalusJob(name, 1.0, 64.0, weight=w, on_demand=True))
                for name, (w, _) in jobs.items()}
    results: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            results[name] = jobs[name][1](admitted[name])
        finally:
            executor.leave(name)

    threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
    for t in threads:
        t.start()
    if together:
        assert all(asked.acquire(timeout=120) for _ in jobs)
        executor.end("gate", 0.0)
        executor.leave("gate")
    for t in threads:
        t.join(120)
    return results


@pytest.mark.slow  # torch's first steps take seconds on a loaded machine
def test_a_07_03_split_gives_retraining_and_inference_their_decided_shares_of_one_lane(state_dir):
    """A real retraining (SGD steps) and a real inference job (batches of frames) in one lane under weighted
    FAIR with weights 0.7/0.3: while both run, the token log's GPU time splits 0.7/0.3 (within 0.1, plus the
    one-iteration lag FAIR allows: a single iteration stretched by a busy CPU moves a 0.1 s span), their
    iterations interleave, and each job's own result is what it computes alone."""
    spec = make_streams(2, seed=0)[0]
    settings, model, truth, config, lanes = _first_window(spec, frames=2000, labelled=400, epochs=15)
    try:
        results = _colocate(lanes, {
            "cam0/train": (0.7, lambda lane: retrain.fn(spec, 0, model, truth, config, settings, lane=lane)),
            "cam0/infer": (0.3, lambda lane: infer_frames.fn(spec, 0, model, 0, settings, lane=lane))},
            together=True)
        log = [end for end in lanes.executor(0).iterations if end[1] != "gate"]
    finally:
        lanes.close()
    span = shared_span(0, log, {"cam0/train": 0.7, "cam0/infer": 0.3}, {"cam0/train": "cam0/train",
                                                                          "cam0/infer": "cam0/infer"})
    assert span is not None and span.iterations >= 100  # both compete from the gate on: all of retraining's 150 steps
    assert span.decided == pytest.approx({"cam0/train": 0.7, "cam0/infer": 0.3})
    assert span.realised["cam0/train"] == pytest.approx(0.7, abs=0.1 + span.lag_bound), span
    assert span.realised["cam0/infer"] == pytest.approx(0.3, abs=0.1 + span.lag_bound), span
    order = [job for _, job, _ in log]
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert switches >= 20  # interleaved at iteration boundaries, not one job after the other
    steps = 15 * -(-settings.n_train // settings.batch)
    assert order.count("cam0/train") == steps and order.count("cam0/infer") == settings.frames // 10
    trained, answers = results["cam0/train"], results["cam0/infer"]
    assert trained.complete and trained.epochs_done == 15 and trained.val_accuracy > 0.5
    alone = infer_segment.fn(spec, 0, model, 0, 500, 1e9, settings)
    shared = answers.segment(500, 1e9)
    assert (shared.frames, shared.processed, shared.correct) == (alone.frames, alone.processed, alone.correct)


@pytest.mark.slow
def test_a_failed_retraining_leaves_the_lane_and_inference_finishes(state_dir):
    """A retraining that raises mid-run (injected) leaves its lane; the inference job sharing it still serves
    every frame."""
    spec = make_streams(1, seed=1)[0]
    settings, model, truth, config, lanes = _first_window(spec, frames=600, labelled=200, epochs=5)

    def failing(lane):
        try:
            retrain.fn(spec, 0, model, truth, config, settings, fail=True, lane=lane)
        except RuntimeError as exc:
            return exc

    try:
        results = _colocate(lanes, {
            "cam0/train": (0.5, failing),
            "cam0/infer": (0.5, lambda lane: infer_frames.fn(spec, 0, model, 0, settings, lane=lane))})
        executor = lanes.executor(0)
        order = [job for _, job, _ in executor.iterations]
        assert executor.controller.lane_views() == ()  # both left: the lane is gone
    finally:
        lanes.close()
    assert "injected failure" in str(results["cam0/train"])
    assert len(results["cam0/infer"].preds) == settings.frames
    assert order.count("cam0/infer") == settings.frames // 10 and order.count("cam0/train") >= 1


def test_bad_executor_fails_with_one_error_before_any_run(state_dir, capsys):
    from flows.continuous_retraining import main, prepare

    args = dict(streams=2, windows=1, window_s=0.5, seed=0, mode="thread", a_min=0.3, delta=0.1, frames=100,
                labelled=100, uniform_config="e5-all-d50", uniform_share=0.5, profile_gpus=0.25, fail_stream=None,
                fail_window=0, registry_prefix="x", policy="thief")
    with pytest.raises(ConfigError, match=r"^executor='mps'"):
        prepare(_pool("ekya-salus-bad"), False, executor="mps", **args)
    assert prepare(_pool("ekya-salus-bad"), False, executor="salus", **args)[2].executor == "salus"
    assert main(["--executor", "mps", "--no-tracking", "--mode", "thread"]) == 2
    assert "executor='mps'" in capsys.readouterr().err


@pytest.mark.usefixtures("prefect_server")
def test_flow_with_salus_executor_produces_accuracy_as_with_slices_and_logs_lanes(state_dir):
    """The same tiny run with slices and with Salus: the same windows, streams and decision shape, accuracies of
    the same size; every Salus window's MLflow run has its lanes, admission waits and realised vs decided
    shares, and the shares a lane realised are within 0.1 of Ekya's split, plus the one iteration FAIR may lag by,
    wherever its jobs competed for 30 iterations or more."""
    from mlflow import MlflowClient

    from flows.continuous_retraining import continuous_retraining, format_summary

    slices = continuous_retraining(**TINY, policy="thief", pool=_pool("ekya-slices"), tracking=False,
                                   registry_prefix="ekya-salus-test")
    target = MlflowTarget(experiment="ekya-salus-test")
    salus = continuous_retraining(**TINY, policy="thief", pool=_pool("ekya-salus"), tracking=target,
                                  registry_prefix="ekya-salus-test", executor="salus")
    assert salus["executor"] == "salus" and salus["streams"] == slices["streams"]
    assert [w["window"] for w in salus["windows"]] == [w["window"] for w in slices["windows"]]
    for a, b in zip(slices["windows"], salus["windows"]):
        assert set(a["accuracy"]) == set(b["accuracy"]) and all(0.0 < v <= 1.0 for v in b["accuracy"].values())
        assert set(a["allocation"]) == set(b["allocation"])
        assert "salus" not in a and b["salus"]["lanes"] >= 1
        assert all(wait < 1.0 for wait in b["salus"]["admission_wait_s"].values())
        for span in b["salus"]["shares"]:
            for job, decided in span["decided"].items():
                assert span["iterations"] < 30 or span["realised"][job] == pytest.approx(
                    decided, abs=0.1 + span["lag_bound"]), span  # one stretched iteration moves a 0.1 s span
    assert salus["mean_accuracy"] == pytest.approx(slices["mean_accuracy"], abs=0.15)
    printed = format_summary(salus)  # what the CLI prints: the accuracy table, then each lane's shares
    assert printed.count("decided->realised") == sum(len(w["salus"]["shares"]) for w in salus["windows"])
    client = MlflowClient(target.resolved_uri())
    runs = client.search_runs([client.get_experiment_by_name("ekya-salus-test").experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{salus['mlflow_run_id']}'")
    windows = [r for r in runs if re.fullmatch(r"thief-window-\d", r.info.run_name)]
    assert len(windows) == 2
    for run in windows:
        metrics = run.data.metrics
        assert metrics["salus.lanes"] >= 1 and "salus.admission_wait_s_max" in metrics
        shares = [k for k in metrics if k.endswith(".realised_share")]
        assert all(k.replace("realised", "decided") in metrics for k in shares)


def test_weighted_fair_gives_no_catch_up_to_a_job_that_starts_iterating_late():
    """Ekya's weights are rates: a job admitted with the others but iterating only later (its worker was still
    starting) must not then hold the lane until its service catches up. Its first iteration restarts the
    lane's FAIR counters, as joining does (thesis §2.4.3, the authors' code)."""
    from gpu.schedulers.salus.controller import Ask, SalusController, SalusJob

    ctl = SalusController(16_000, "weighted_fair")
    ctl.on_arrival(0.0, SalusJob("train", 10, 100, weight=0.7, on_demand=True))
    ctl.on_arrival(0.0, SalusJob("infer", 10, 100, weight=0.3, on_demand=True))
    assert ctl.on_arrival(0.0, Ask("train")).runs[0].job_id == "train"
    for k in range(50):  # train alone for 50 iterations of 10 ms
        ctl.on_iteration(0.01 * k, "train", 0.01, more=True)
    ctl.on_arrival(0.5, Ask("infer"))
    runs = []
    for k in range(20):  # both now ask at every boundary; iterations of 10 ms
        job = ctl.running[0]
        runs.append(job)
        ctl.on_iteration(0.5 + 0.01 * k, job, 0.01, more=True)
    assert runs.count("infer") == pytest.approx(6, abs=1)  # 0.3 of the lane from its first iteration on


def test_salus_executor_keeps_a_worker_process_per_co_located_job():
    """Process mode: a device's co-located jobs each get a worker, so an admitted job never waits for one."""
    from flows.continuous_retraining import runner_settings
    from tasks.ekya.salus import JOBS_PER_DEVICE

    pool = _pool("ekya-salus-workers")
    assert runner_settings({"pool": pool, "executor": "salus"})["workers_per_device_set"] == JOBS_PER_DEVICE >= 4
    assert "workers_per_device_set" not in runner_settings({"pool": pool, "executor": "slices"})
