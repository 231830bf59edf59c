"""Waiting on what another process or the Prefect server does in its own time: poll a condition, fail naming it."""

from __future__ import annotations

import time

import pytest


def poll(condition, timeout: float, what: str):
    """Return ``condition()`` once truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def final_task_run_state(task_run_id):
    """The task run's final state in the Prefect API (Prefect records task runs from their engines'
    events, so a state can reach the API a little after the flow saw it)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    def read():
        with get_client(sync_client=True) as client:
            try:
                state = client.read_task_run(task_run_id).state
            except ObjectNotFound:
                return None
        return state if state and state.is_final() else None

    # the server records task runs from events in the background: at a load of 15 that took over 30 s
    return poll(read, 120, f"task run {task_run_id} in a final state in the Prefect API")
