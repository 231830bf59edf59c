"""Nexus's epoch reaction to a load step (Fig. 13): the beacon-by-beacon simulation with the real planner."""

from __future__ import annotations

import pytest

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.nexus.synthetic import synthetic_profiles
from gpu.sim.nexus.epochs import step_timeline

PROFILES = synthetic_profiles()
SESSIONS = [Session("a", "resnet50", 100.0, 900.0), Session("b", "resnet50", 50.0, 500.0)]


@pytest.fixture(scope="module")
def tripled():
    return step_timeline(PROFILES, SESSIONS, step_at_s=35.0, scale=3.0, duration_s=90.0, arrivals="uniform")


def test_plan_serves_the_base_load_until_the_step(tripled):
    assert tripled.steady_bad_rate <= 0.001
    assert all(b.offered > 0 for b in tripled.beacons)


def test_step_beyond_the_plan_spikes_the_bad_rate_until_an_epoch_adds_gpus(tripled):
    assert tripled.spike_bad_rate > 0.2  # three times the load the plan was sized for
    assert tripled.gpus_after > tripled.gpus_before
    assert tripled.gpu_reaction_s is not None and tripled.gpu_reaction_s <= 30.0  # within one epoch (paper: 12 s)
    settled = [b.bad_rate for b in tripled.beacons[-5:]]
    assert max(settled) < tripled.spike_bad_rate / 4


def test_step_outside_the_run_is_named():
    with pytest.raises(ConfigError, match="step_at_s=90"):
        step_timeline(PROFILES, SESSIONS, step_at_s=90.0, scale=2.0, duration_s=60.0)
