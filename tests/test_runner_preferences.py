"""Soft constraints in the local task runner (ESCHER §4.4g, Fig. 4.4a): a task names requests in preference
order and lands on the first the pool ledger grants within its share of the timeout, never leaking a lease."""

from __future__ import annotations

import time

import pytest
from prefect import flow, task
from prefect.states import StateType

from gpu.errors import ConfigError
from gpu.placement import ResourceRequest
from tasks.runtime.requests import current_placement, gpu_options, gpu_request, resolve_requests
from tasks.runtime.runners import GpuTaskRunner


@task
def where_am_i() -> dict:
    p = current_placement()
    return {"devices": p.gpu_indices, "fraction": p.fraction, "at": time.time()}


def test_preferences_refine_the_task_request_in_order():
    """Each entry replaces the task's fields and adds its resources to the task's own (AND within, OR across)."""
    @gpu_request(gpus=0.5, resources={"fair-a": 1}, prefer=[{"gpus": 1, "resources": {"anti-x": 1}}, {}])
    @task
    def declared() -> None: ...

    first, second = resolve_requests(declared)
    assert (first.gpus, first.resources) == (1.0, {"fair-a": 1.0, "anti-x": 1.0})
    assert (second.gpus, second.resources) == (0.5, {"fair-a": 1.0})
    with gpu_options(prefer=[{"devices": [1]}]):
        only, = resolve_requests(declared)
    assert only.devices == (1,) and only.gpus == 0.5
    assert len(resolve_requests(where_am_i)) == 1


@pytest.mark.parametrize("bad", [[], {"gpus": 1}, "gpus", [{"gpu": 1}], [3], [{"gpus": -1}]])
def test_a_bad_preference_list_is_one_config_error_naming_prefer(bad):
    with pytest.raises(ConfigError, match=r"prefer|gpus"):
        with gpu_options(prefer=bad):
            pass
    with pytest.raises(ConfigError, match=r"prefer|gpus"):
        gpu_request(prefer=bad)


@pytest.mark.usefixtures("prefect_server")
def test_a_task_lands_on_its_second_choice_when_the_first_cannot_be_had_and_leaks_no_lease(state_dir, sim_pool):
    """GPU 0 is held by someone else for the whole run: the task's first choice (GPU 0) times out after its
    half of the 2 s timeout, the second (any GPU) is granted GPU 1; once GPU 0 is free the first choice wins."""
    pool = sim_pool("prefer")
    runner = GpuTaskRunner(pool=pool, mode="thread", tracking=False, allocation_timeout=2.0)

    @flow(task_runner=runner)
    def preferring():
        ledger = runner.ledger()
        holder = ledger.allocate(ResourceRequest(gpus=1, devices=(0,), label="someone else"), timeout=1)
        start = time.time()
        with gpu_options(gpus=1, prefer=[{"devices": [0]}, {}]):
            fallback = where_am_i.submit().result()
        ledger.release(holder.lease_id)
        with gpu_options(gpus=1, prefer=[{"devices": [0]}, {}]):
            preferred = where_am_i.submit().result()
        return fallback, preferred, fallback["at"] - start

    fallback, preferred, waited = preferring()
    assert fallback["devices"] == (1,) and preferred["devices"] == (0,)
    assert 0.9 <= waited < 2.0  # the first choice had its share (1 s), not the whole timeout
    ledger = pool.open_ledger()
    assert ledger.leases() == [] and ledger.waiting() == 0


@pytest.mark.usefixtures("prefect_server")
def test_a_preference_that_can_never_fit_falls_through_at_once_and_none_fitting_fails_in_the_flow(state_dir, sim_pool):
    pool = sim_pool("prefer-never", "1x16GiB")

    @flow(task_runner=GpuTaskRunner(pool=pool, mode="thread", tracking=False, allocation_timeout=30.0))
    def never():
        start = time.time()
        with gpu_options(prefer=[{"gpus": 4}, {"gpus": 1}]):
            placed = where_am_i.submit().result()
        return placed, time.time() - start

    placed, took = never()
    assert placed["devices"] == (0,) and took < 5  # not 15 s waiting for four GPUs on a one-GPU pool

    @flow(task_runner=GpuTaskRunner(pool=pool, mode="thread", tracking=False))
    def none_fits():
        with gpu_options(prefer=[{"gpus": 4}, {"gpus": 2}]):
            return where_am_i.submit(return_state=True)

    with pytest.raises(Exception, match="can never fit"):
        none_fits()
    assert pool.open_ledger().leases() == []


@pytest.mark.usefixtures("prefect_server")
def test_a_task_that_gets_none_of_its_preferences_fails_and_holds_nothing(state_dir, sim_pool):
    pool = sim_pool("prefer-none", "1x16GiB")
    runner = GpuTaskRunner(pool=pool, mode="thread", tracking=False, allocation_timeout=0.6)

    @flow(task_runner=runner)
    def starved_state():
        ledger = runner.ledger()
        holder = ledger.allocate(ResourceRequest(gpus=1), timeout=1)
        with gpu_options(gpus=1, prefer=[{"devices": [0]}, {}]):
            future = where_am_i.submit()
            future.wait()
        ledger.release(holder.lease_id)
        return future.state.type, future.state.message  # (a failed State returned would fail the flow)

    kind, message = starved_state()
    assert kind == StateType.FAILED and "none of its 2 preferred requests" in message
    assert pool.open_ledger().leases() == []
