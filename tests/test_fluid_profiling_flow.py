"""FLUID's flow on measured trials (thesis §3.5): profiled runtimes move the widths, c packed trials run at once.

The acceptance test a formula cannot pass: two runs of the same 3-config grid, same budgets and the same
numbers everywhere; in the second, one configuration's real torch model is 128x wider (the code, not the config,
changes). Only a profiler that times the real work sees it, and StaticFluid (Algorithm 3.1) must then give that
trial a whole GPU and pack the other two on the other GPU.
"""

from __future__ import annotations

import pytest

from flows.trial_groups import trial_groups
from gpu.schedulers.fluid.algorithms import FluidParams, static_fluid
from resource_blocks import GpuPool

pytestmark = pytest.mark.usefixtures("prefect_server")

HEAVY_HIDDEN = 48  # the configuration whose model the test widens
WIDER = 128  # how much wider its real model becomes (hidden 48 -> 6144 units)
SPACE = {"lr": 0.1, "hidden": {"grid": [16, 32, HEAVY_HIDDEN]}, "batch_size": 64}


def _grid(name: str, gpus: str, **kwargs) -> dict:
    return trial_groups(algorithm="grid", space=SPACE, pool=GpuPool(name=name, device_backend="simulated",
                                                                    simulated=gpus),
                        tracking=False, progress=False, **kwargs)


def _hidden_of(summary: dict, tid: str) -> int:
    return int(summary["trial_times"][tid]["config"]["hidden"])


@pytest.fixture(scope="module")
def light_and_heavy(prefect_server, state_folder):
    """The same grid twice on 2 simulated GPUs (c = 2, d = 1): as shipped, then with one model 128x wider."""
    import tasks.fluid.trials as trials

    runs = {}
    for label in ("light", "heavy"):
        with state_folder(f"fluid-{label}"), pytest.MonkeyPatch.context() as env:
            if label == "heavy":
                original = trials.build_mlp
                env.setattr(trials, "build_mlp",
                            lambda hidden: original(hidden * WIDER if int(hidden) == HEAVY_HIDDEN else hidden))
            runs[label] = _grid(f"fluid-{label}", "2x16GiB", iterations=2, chunk=2, c=2, d=1, mode="thread")
    return runs


def test_profiled_iteration_time_follows_the_real_model_not_the_budget(light_and_heavy):
    light, heavy = light_and_heavy["light"], light_and_heavy["heavy"]
    key = f"hidden={HEAVY_HIDDEN} batch=64"
    # 128x the flops; an epoch of small batches also pays a fixed per-batch cost, so the time grows less
    assert heavy["profiles"][key]["iter_s"] > 2 * light["profiles"][key]["iter_s"], (light["profiles"],
                                                                                      heavy["profiles"])
    for s in (light, heavy):  # every trial's runtime is budget x its measured t1
        for tid, t in s["trial_times"].items():
            assert t["h1_s"] == pytest.approx(2 * t["iter_time_s"]) and t["iter_time_s"] != 1.0
            assert t["iter_time_s"] == s["profiles"][f"hidden={_hidden_of(s, tid)} batch=64"]["iter_s"]


def test_a_heavier_trial_gets_a_whole_gpu_and_the_others_pack(light_and_heavy):
    """Light: three similar trials, each 1/c of a GPU. Heavy: the wide model's share of the group's work passes
    1/2 of 2 GPUs, so Algorithm 3.1 gives it one GPU alone and packs the two others on the other GPU."""
    widths = {label: {_hidden_of(s, tid): chunks[0]["width"] for tid, chunks in s["placements"].items()}
              for label, s in light_and_heavy.items()}
    assert widths["light"] == {16: 0.5, 32: 0.5, HEAVY_HIDDEN: 0.5}
    assert widths["heavy"] == {16: 0.5, 32: 0.5, HEAVY_HIDDEN: 1.0}
    heavy = light_and_heavy["heavy"]
    devices = {_hidden_of(heavy, tid): tuple(chunks[0]["devices"]) for tid, chunks in heavy["placements"].items()}
    assert devices[16] == devices[32] != devices[HEAVY_HIDDEN]
    # the decision is Algorithm 3.1 on the measured runtimes, nothing else
    from gpu.schedulers.fluid.algorithms import Trial

    measured = [Trial(tid, 2, iter_time_s=t["iter_time_s"]) for tid, t in heavy["trial_times"].items()]
    assert dict(static_fluid(measured, 2, FluidParams(c=2, d=1)).widths)["c0002@0"] == 1.0


def test_the_flow_reports_its_makespan_and_each_groups(light_and_heavy):
    for s in light_and_heavy.values():
        chunks = [c for t in s["placements"].values() for c in t]
        span = max(c["finished_at"] for c in chunks) - min(c["started_at"] for c in chunks)
        assert s["makespan_s"] >= span > 0
        assert list(s["group_makespans_s"].values()) == [pytest.approx(s["makespan_s"], abs=1.0)]
        assert s["d"] == 1 and s["scaling"]["widths"] == [1, 2]  # beta measured over both GPUs


def test_beta_measured_on_a_simulated_pool_keeps_d_at_one(prefect_server, tmp_path, monkeypatch):
    """A wide trial on a simulated pool runs on one CPU thread: no speed-up, so the derived d is 1."""
    monkeypatch.setenv("GPUFLOWS_STATE_DIR", str(tmp_path))
    s = _grid("fluid-beta", "2x16GiB", iterations=1, chunk=1, c=2, d=None, mode="thread")
    assert s["d"] == 1 and s["d_source"].startswith("measured") and s["beta"] > 1.5, s["scaling"]


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals that contain one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = best = 0
    for _, change in events:  # at a tie an end (-1) sorts first: touching intervals do not overlap
        running += change
        best = max(best, running)
    return best


def test_c_packed_trials_really_run_at_once_in_process_mode(prefect_server, tmp_path, monkeypatch):
    """c = 3 on one device: the process runner keeps 3 workers there, so three trials train at the same instant
    (with 2 workers per device, as before, at most two could: the third held its lease and waited for a worker).

    Each trial runs 4 chunks: the first chunks may start one by one while worker processes start on a busy
    machine; after that every trial's chunks follow each other on a warm worker of its own.
    """
    monkeypatch.setenv("GPUFLOWS_STATE_DIR", str(tmp_path))
    space = {"lr": 0.1, "hidden": {"grid": [512, 1024, 1536]}, "batch_size": 16}
    s = trial_groups(algorithm="grid", space=space, iterations=40, chunk=10, c=3, d=1, mode="process",
                     pool=GpuPool(name="fluid-c3", device_backend="simulated", simulated="1x16GiB"),
                     tracking=False, progress=False)
    chunks = [c for t in s["placements"].values() for c in t]
    assert len(chunks) == 12 and all(c["devices"] == [0] for c in chunks)
    # all three start packed at 1/3 of the device; a trial left alone once the others finish may be given more
    # (whether one is depends on how far the machine's load let each trial get)
    assert all(t[0]["width"] == pytest.approx(1 / 3) for t in s["placements"].values())
    assert all(c["width"] >= 1 / 3 - 1e-9 for c in chunks)
    spans = [(c["started_at"], c["finished_at"]) for c in chunks]
    assert most_at_once(spans) == 3, sorted(spans)


def test_most_at_once_counts_overlaps():
    assert most_at_once([(0, 2), (1, 3), (2, 4)]) == 2 and most_at_once([(0, 5), (1, 3), (2, 4)]) == 3


def test_the_runner_keeps_as_many_workers_per_device_as_fluid_may_pack(state_dir):
    """c given: c workers; c derived: the largest level of the curve it will be fitted from."""
    from flows.trial_groups import runner_settings
    from gpu.schedulers.fluid.algorithms import fit_packing_curve, save_packing_curve

    pool = GpuPool(name="fluid-workers", device_backend="simulated", simulated="1x16GiB")
    assert runner_settings({"pool": pool, "c": 3})["workers_per_device_set"] == 3
    assert runner_settings({"pool": pool, "c": None})["workers_per_device_set"] == 4  # start-up curve: p = 1..4
    save_packing_curve(fit_packing_curve(list(range(1, 9)), [100.0 * p ** 0.5 for p in range(1, 9)]), "cpu")
    assert runner_settings({"pool": pool, "c": None})["workers_per_device_set"] == 8
