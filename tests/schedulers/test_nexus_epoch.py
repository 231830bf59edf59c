"""Epoch re-planning (Nexus §5/§6.1 incremental): triggers, minimum epoch gap, plan stability."""

import pytest

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Session, SquishyPacker
from gpu.schedulers.nexus.epoch import EpochConfig, EpochPlanner
from gpu.schedulers.nexus.profiles import linear_profile

PROFILES = {"m": linear_profile("m", 1.0, 10.0, 64)}


def planner():
    return EpochPlanner(SquishyPacker(PROFILES), [Session("s", "m", 100, 100.0)])


def feed(p, rate_at, until):
    epochs = []
    for t in range(1, until + 1):
        if p.observe(float(t), {"s": rate_at(t)}) is not None:
            epochs.append(t)
    return epochs


def test_steady_rate_keeps_the_plan_and_only_ticks_the_epoch_timer():
    p = planner()
    before = p.plan
    assert feed(p, lambda t: 100.0, 65) == []
    assert p.epochs == [30.0, 60.0] and p.plan is before and p.moves == 0


def test_a_load_jump_triggers_an_early_epoch_once_the_history_is_full():
    p = planner()
    epochs = feed(p, lambda t: 100.0 if t <= 30 else 200.0, 45)
    assert epochs and 30 < epochs[0] < 45  # early: before the 60 s periodic epoch
    assert p.allocated("s") > 1.1 * 100  # the new plan grew the session


def test_small_drift_below_the_shrink_threshold_does_not_replan():
    p = planner()
    assert feed(p, lambda t: 98.0, 35) == []


def test_epoch_config_rejects_min_epoch_longer_than_epoch():
    with pytest.raises(ConfigError, match="min_epoch_s"):
        EpochConfig(epoch_s=5, min_epoch_s=10)


def test_observing_an_unknown_session_is_a_config_error():
    with pytest.raises(ConfigError, match="session_id"):
        planner().observe(1.0, {"other": 1.0})


def test_a_planner_on_a_fixed_cluster_caps_every_plan_and_lists_what_does_not_fit():
    # T = 40 / 50 ms = 800 req/s per GPU: 2000 req/s needs 3 GPUs, the cluster has 2
    p = EpochPlanner(SquishyPacker(PROFILES), [Session("s", "m", 100, 2000.0)], max_gpus=2)
    assert p.plan.num_gpus == 2 and sum(r for _, r in p.plan.unassigned) > 0
    assert feed(p, lambda t: 2000.0 if t <= 30 else 4000.0, 50)  # the surge re-plans ...
    assert p.plan.num_gpus == 2 and sum(r for _, r in p.plan.unassigned) > 2000  # ... within the cluster
    uncapped = EpochPlanner(SquishyPacker(PROFILES), [Session("s", "m", 100, 2000.0)])
    assert uncapped.plan.num_gpus == 3 and not uncapped.plan.unassigned
