"""GpuTaskRunner(admission=SalusColocation(...)) in real Prefect flows: tasks admitted into lanes by their device's executor, which holds
the one device lease; iterations never overlap in a lane; a failing task frees its lane; bad declarations
fail in the flow before any work."""

from __future__ import annotations

import pickle
import time

import pytest
from prefect import flow, task
from prefect.states import StateType

from gpu.errors import ConfigError, NeverFitsError
from resource_blocks import GpuPool
from tasks.runtime.flow import flow_runner, settings
from tasks.runtime.requests import current_placement, gpu_options
from tasks.salus.admission import SalusAdmission, SalusColocation, salus_executor, salus_settings
from tasks.salus.executor import salus_iterations, salus_job
from tasks.salus.placement import current_lane, placement_lane
from tasks.runtime.runners import GpuTaskRunner

def _pool(name: str) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="1x16GiB")


@salus_job(persistent="200MiB", ephemeral="1GiB", expected_s=1.0)
@task
def tiny_trainer(fail_at: int | None = None) -> dict:
    """A real (tiny) torch trainer: each Salus iteration is a few SGD steps of an MLP."""
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    spans, losses = [], []
    for step in salus_iterations(4):
        start = time.perf_counter()
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        if step == fail_at:
            raise RuntimeError("failed mid-iteration")
        spans.append((start, time.perf_counter()))
        losses.append(loss.item())
    lane = current_lane()
    return {"lane": lane.lane_id, "cap": lane.memory_cap, "spans": spans, "losses": losses,
            "leases": len(_pool("salus-runner").open_ledger().leases())}


@pytest.mark.usefixtures("prefect_server")
def test_tasks_share_one_device_lease_and_one_lane_without_overlapping(state_dir):
    @flow(task_runner=GpuTaskRunner(pool=_pool("salus-runner"), mode="thread", admission=SalusColocation(policy="fair"),
                                      tracking=False))
    def colocated():
        return [f.result() for f in [tiny_trainer.submit() for _ in range(3)]]

    results = colocated()
    assert {r["lane"] for r in results} == {0} and all(r["leases"] == 1 for r in results)
    assert all(r["losses"][-1] < r["losses"][0] for r in results)  # they really trained
    spans = sorted(s for r in results for s in r["spans"])
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))
    assert results[0]["cap"] == int((200 * 1.1 * 1.05 + 1024 * 1.05) * 2 ** 20)
    assert _pool("salus-runner").open_ledger().leases() == []


@pytest.mark.usefixtures("prefect_server")
def test_a_failing_task_frees_its_lane_and_the_others_finish(state_dir):
    @flow(task_runner=GpuTaskRunner(pool=_pool("salus-runner"), mode="thread", admission=SalusColocation(policy="pack"),
                                      tracking=False))
    def one_fails():
        bad, good = tiny_trainer.submit(fail_at=1), tiny_trainer.submit()
        return bad.wait() or bad.state, good.result()

    state, good = one_fails()
    assert state.type == StateType.FAILED and len(good["spans"]) == 4
    assert _pool("salus-runner").open_ledger().leases() == []


@salus_job(expected_s=1.0)
@task
def profiled_trainer() -> dict:
    """The same trainer declaring no memory: the runner profiles its first iterations."""
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    losses = []
    for _ in salus_iterations(4):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"profiled": current_lane().profile_iterations, "losses": losses}


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_task_declaring_no_memory_is_profiled_then_runs_beside_a_declared_one(state_dir):
    @flow(task_runner=GpuTaskRunner(pool=_pool("salus-runner"), mode="thread",
                                    admission=SalusColocation(policy="srtf"), tracking=False))
    def mixed():
        return profiled_trainer.submit().result(), tiny_trainer.submit().result()

    profiled, declared = mixed()
    assert profiled["profiled"] == 2 and len(profiled["losses"]) == 4 and len(declared["spans"]) == 4
    assert _pool("salus-runner").open_ledger().leases() == []


@task
def whole_device() -> None:
    pass


@salus_job(persistent="9GiB", ephemeral="9GiB")
@task
def too_big() -> None:
    pass


@salus_job(persistent="1GiB", ephemeral="1GiB")
@task
def no_expected_time() -> None:
    pass


@pytest.mark.usefixtures("prefect_server")
def test_bad_declarations_fail_in_the_flow_before_any_work(state_dir):
    for bad, error, match in ((whole_device, ConfigError, "gpus.*'whole_device'.*only Salus executors"),
                              (too_big, NeverFitsError, "too_big.*16384 MB"),
                              (no_expected_time, ConfigError, "expected_s")):
        @flow(task_runner=GpuTaskRunner(pool=_pool("salus-runner"), mode="thread",
                                        admission=SalusColocation(policy="srtf"), tracking=False))
        def submits():
            with gpu_options(gpus=1):
                bad.submit()

        with pytest.raises(error, match=match):
            submits()
    with pytest.raises(ConfigError, match="salus_policy"):
        GpuTaskRunner(admission=SalusColocation(policy="lottery"))


def test_runner_is_a_configuration_value():
    a = GpuTaskRunner(admission=SalusColocation(policy="srtf", devices=(0, 1), max_jobs_per_device=4))
    assert a.duplicate() == a and pickle.loads(pickle.dumps(a)) == a
    assert a != GpuTaskRunner(admission=SalusColocation(policy="fair")) and a != GpuTaskRunner()
    for field, bad in (("salus_devices", (0, 0)), ("max_jobs_per_device", 0), ("salus_workers", "gpu"),
                       ("salus_admission", "greedy"), ("mode", "salsa")):
        with pytest.raises(ConfigError, match=field):
            GpuTaskRunner(**{"mode": bad} if field == "mode" else salus_settings({"mode": "salus", field: bad}))


def _from_parameters(parameters: dict) -> dict:
    return settings(parameters, _pool("salus-runner"), **salus_settings(parameters))


@pytest.mark.usefixtures("prefect_server")
def test_a_flow_run_parameter_selects_salus_mode_as_a_deployment_would(state_dir):
    @flow(task_runner=GpuTaskRunner(configure=_from_parameters))
    def picked(mode: str = "thread", salus_policy: str = "pack", salus_workers: str = "thread",
               tracking: bool = False):
        runner = flow_runner()
        lanes = [f.result()["lane"] for f in [tiny_trainer.submit() for _ in range(2)]]
        return runner.admission.name, runner.admission.policy, lanes

    assert picked(mode="salus", salus_policy="fair") == ("salus", "fair", [0, 0])
    assert _pool("salus-runner").open_ledger().leases() == []


@pytest.mark.usefixtures("prefect_server")
def test_process_mode_gives_each_admitted_job_a_worker(state_dir):
    @flow(task_runner=GpuTaskRunner(pool=_pool("salus-runner"), admission=SalusColocation(policy="fair",
                                      max_jobs_per_device=2), tracking=False))
    def colocated():
        return [f.result() for f in [tiny_trainer.submit() for _ in range(2)]]

    results = colocated()
    spans = sorted(s for r in results for s in r["spans"])
    assert len(spans) == 8 and all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))


@task
def plain_step() -> dict:
    """A task that is no Salus job (a data loader, an evaluation): it reports the slice it got and, on a Salus
    device, the executor's Eq. 2.1 account while it holds its memory."""
    placement = current_placement()
    lease = placement.placement
    seen = {"devices": lease.devices, "memory": lease.memory, "lane": placement_lane(placement)}
    if lease.devices == (0,):
        lanes = salus_executor(flow_runner(), 0).controller.lanes
        seen |= {"used_mb": lanes.used_mb(), "room_for_2g_2g": lanes.find(*lanes.margins.charge(2048, 2048)).outcome,
                 "leases_on_gpu0": [x.label for x in flow_runner().ledger().leases() if x.devices == (0,)]}
    return seen


@task
def plain_failure() -> None:
    raise RuntimeError("injected failure of a plain task")


@pytest.mark.usefixtures("prefect_server")
def test_plain_tasks_take_plain_slices_beside_salus_jobs(state_dir):
    """A loader (no GPU) gets a CPU lease, an evaluation a slice of the device no executor holds, and a plain task
    pinned to the Salus device is charged in that executor's account, not given a second lease of the device."""
    pool = GpuPool(name="salus-mixed", device_backend="simulated", simulated="2x16GiB")

    @flow(task_runner=GpuTaskRunner(pool=pool, mode="thread", admission=SalusColocation(policy="fair", devices=(0,)),
                                    tracking=False))
    def mixed():
        loader = plain_step.submit()
        with gpu_options(gpus=0.5):
            evaluation = plain_step.submit()
        trainers = [tiny_trainer.submit() for _ in range(2)]
        with gpu_options(memory="12GiB", devices=(0,)):
            tenant = plain_step.submit()
            failed = plain_failure.submit()
        failed.wait()
        still_charged = list(salus_executor(flow_runner(), 0).controller.lanes.persistent)
        return (loader.result(), evaluation.result(), tenant.result(), [t.result() for t in trainers], failed.state,
                still_charged)

    loader, evaluation, tenant, trainers, failed, still_charged = mixed()
    assert failed.is_failed() and not any(job.startswith("plain_failure") for job in still_charged)
    assert loader["devices"] == () and evaluation["devices"] == (1,) and evaluation["lane"] is None
    assert tenant["devices"] == (0,) and tenant["memory"] == 12 * 2 ** 30 and tenant["lane"] is None
    assert tenant["leases_on_gpu0"] == ["salus-gpu0"]           # the executor's lease only
    assert tenant["used_mb"] >= 12 * 1024 * 1.1 * 1.05          # its 12 GiB is charged as persistent memory
    assert tenant["room_for_2g_2g"] == "not_found"               # so a job that would over-commit waits
    assert all(len(t["spans"]) == 4 for t in trainers)
    assert pool.open_ledger().leases() == []


def test_a_plain_gpu_task_goes_where_no_executor_holds_the_device_else_beside_the_lanes(state_dir):
    """Routing of a task that is no Salus job: on a two-GPU pool a fraction leases the other device; on a one-GPU
    pool (or pinned to the Salus device) its executor hosts it; whole Salus devices are refused, naming the task."""
    from gpu.placement import ResourceRequest

    def route(simulated: str, **request):
        pool = GpuPool(name=f"salus-route-{simulated}", device_backend="simulated", simulated=simulated)
        ledger = pool.open_ledger()
        try:
            return SalusAdmission(SalusColocation(devices=(0,)), lambda: ledger, None, lambda *_: None).ledger_request(
                plain_step, ResourceRequest(**request))
        finally:
            ledger.close()

    assert route("2x16GiB", gpus=0.5).devices == (1,)
    assert route("2x16GiB", gpus=0.0).devices is None                    # CPU only: as asked
    assert route("2x16GiB", gpus=0.5, devices=(0,)) is None              # pinned to the Salus device: a tenant
    assert route("1x16GiB", memory="4GiB") is None                       # only the Salus device: a tenant
    assert route("1x16GiB") == ResourceRequest()
    with pytest.raises(ConfigError, match="gpus=1.0.*'plain_step'"):
        route("1x16GiB", gpus=1)
    with pytest.raises(NeverFitsError):
        route("2x16GiB", memory="20GiB", devices=(1,))                   # pinned elsewhere, never fits there
