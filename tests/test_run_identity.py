"""Where a user finds a run: one MLflow experiment per system whatever started the run, a name that says system,
policy and placement (the same in Prefect and MLflow), and on real GPUs one machine-wide default pool."""

from __future__ import annotations

import importlib

import pytest

from gpuflows.args import flow_arguments
from resource_blocks import GpuPool, MlflowTarget

WHEN = 1_800_000_000.0  # 2027-01-15, in every time zone
RUNNER_FLOWS = ("pool_demo", "continuous_retraining", "allocation_rounds", "trial_groups", "serving_rollout",
                "gpu_sharing", "escher_policies")


def _command_line_target(module: str, **given) -> MlflowTarget:
    """The MLflow target a flow's runner ends up with when its command line started it: ``run_checked`` settles the
    target outside the flow (``prepare``) and hands it to the flow, whose runner resolves it again."""
    flows = importlib.import_module(f"flows.{module}")
    kwargs = flow_arguments(getattr(flows, module), **given)  # the flow is named like its module
    kwargs["pool"], kwargs["tracking"], *_ = flows.prepare(**kwargs)
    return flows.runner_settings(kwargs)["tracking"]


@pytest.mark.parametrize("module, given, experiment", [
    ("continuous_retraining", {"pool": GpuPool(name="cli-ekya", device_backend="simulated")}, "gpuflows-ekya"),
    ("allocation_rounds", {"pool": GpuPool(name="cli-cil", device_backend="simulated", simulated="1x16GiB")},
     "gpuflows-cilantro"),
    ("trial_groups", {"pool": GpuPool(name="cli-fluid", device_backend="simulated")}, "gpuflows-fluid"),
])
def test_a_command_line_run_lands_in_its_systems_experiment(state_dir, module, given, experiment):
    """These three once logged command-line runs to ``gpuflows`` and deployment runs to ``gpuflows-<system>``."""
    assert _command_line_target(module, **given).resolved_experiment() == experiment
    flows = importlib.import_module(f"flows.{module}")
    assert flows.runner_settings({})["tracking"].resolved_experiment() == experiment  # a deployment run
    named = MlflowTarget(experiment="mine")  # an experiment the user names wins, whatever the entry point
    assert flows.runner_settings({"tracking": named})["tracking"].experiment == "mine"


def test_serving_runs_name_their_system_placement_and_batch_policy():
    """Nexus, Nona and Nona's Opportunistic baseline once all ran as ``nexus-early_drop-<minute>`` in one
    experiment: the two runs meant to be compared could not be told apart."""
    from flows.serving_rollout import identity

    nona = "scenarios/serving/diamond_nona.yaml"
    runs = {label: identity(params) for label, params in {
        "nexus": {}, "nona": {"spec": nona, "placement": "nona"}, "opportunistic": {"spec": nona, "placement":
                                                                                    "opportunistic"},
        "nona-spec": {"spec": nona}, "orloj": {"batch_policy": "orloj"}}.items()}
    assert {k: r.experiment for k, r in runs.items()} == {
        "nexus": "gpuflows-nexus", "nona": "gpuflows-nona", "opportunistic": "gpuflows-nona",
        "nona-spec": "gpuflows-nona", "orloj": "gpuflows-orloj"}
    names = {k: r.run_name(WHEN) for k, r in runs.items()}
    assert names["nexus"].startswith("nexus-early_drop-20")
    assert names["nona"].startswith("nona-early_drop-20")
    assert names["opportunistic"].startswith("nona-opportunistic-early_drop-20")
    assert names["orloj"].startswith("orloj-20")
    assert len({names["nexus"], names["nona"], names["opportunistic"]}) == 3  # started in the same second
    assert identity({"spec": "no/such/spec.yaml"}).experiment == "gpuflows-nexus"  # bad input: the flow reports it


def test_every_flow_names_its_prefect_runs_like_its_mlflow_runs():
    """Prefect's flow runs were random word pairs; each flow now names them ``<system>-<policy>-...-<time>``,
    from the same identity that names its MLflow run and experiment."""
    for module in RUNNER_FLOWS:
        flows = importlib.import_module(f"flows.{module}")
        (flow,) = [v for v in vars(flows).values() if getattr(v, "flow_run_name", None) is not None
                   and hasattr(v, "fn")]
        who = flows.identity({})
        assert who.experiment == flows.runner_settings({})["tracking"].resolved_experiment(), module
        assert who.run_name(WHEN).split("-")[0] == who.system, module
    from flows.continuous_retraining import identity as ekya
    from flows.allocation_rounds import identity as cilantro
    from flows.trial_groups import identity as fluid

    assert ekya({"policy": "uniform", "executor": "salus"}).run_name(WHEN).startswith("ekya-uniform-salus-2027-")
    assert cilantro({"policy": "cilantro-njc", "run_name": "cilantro-prod"}).run_name(WHEN).startswith(
        "cilantro-njc-prod-")
    assert fluid({"execution": "fifo", "algorithm": "grid", "placement": "escher"}).run_name(WHEN).startswith(
        "fluid-fifo-grid-escher-")


def test_on_real_gpus_every_flows_default_pool_is_the_machines_one_pool(state_dir, tmp_path, monkeypatch):
    """Real devices have one ledger per machine (``gpu.claims`` refuses a second on the same UUIDs): flows started
    side by side with their own default pools ("demo", "cilantro", "salus", "serving", ...) would fail, so on NVML
    devices every default is the machine's pool and they queue on one ledger; simulated pools keep their names."""
    import gpu.devices
    from gpu.devices import Device
    from gpu.errors import ConfigError
    from gpu.ledger import ResourceRequest

    monkeypatch.setenv("GPUFLOWS_DEVICE_REGISTRY", str(tmp_path / "registry"))
    simulated = {m: importlib.import_module(f"flows.{m}").runner_settings({})["pool"].name for m in RUNNER_FLOWS}
    assert simulated["pool_demo"] == "demo" and simulated["allocation_rounds"] == "cilantro"  # no GPU: their own
    assert simulated["escher_policies"] == "escher"

    gpus = tuple(Device(i, f"GPU-fake-{tmp_path.name}-{i}", "NVML-like GPU", 2**34, 2**34) for i in range(2))
    monkeypatch.setattr(gpu.devices, "nvml_devices", lambda: gpus)  # the ledger tests' fake UUIDs, not simulated
    pools = {m: importlib.import_module(f"flows.{m}").runner_settings({})["pool"] for m in RUNNER_FLOWS}
    assert {m: p.name for m, p in pools.items() if m != "escher_policies"} == {
        m: "default" for m in RUNNER_FLOWS if m != "escher_policies"}
    assert pools["escher_policies"].name == "escher"  # 4 simulated nodes: a world of its own
    demo, cilantro = pools["pool_demo"].open_ledger(), pools["allocation_rounds"].open_ledger()
    held = demo.allocate(ResourceRequest(gpus=2), timeout=5)
    assert cilantro.try_grant(cilantro.submit(ResourceRequest(gpus=1))) is None  # queued behind the demo's lease
    demo.release(held.lease_id)
    with pytest.raises(ConfigError, match="belong to the ledger"):  # what the old per-flow names ran into
        GpuPool(name="cilantro", simulated="1x16GiB").open_ledger()
