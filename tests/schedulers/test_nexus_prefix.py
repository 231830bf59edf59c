"""Prefix batching (Nexus §6.3): merged profiles, memory per variant, equal-SLO grouping."""

import pytest

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.nexus.prefix import PrefixGroup, merge_sessions, variant_profiles
from gpu.schedulers.nexus.profiles import linear_profile
from gpu.schedulers.nexus.policies import POLICIES as STRATEGIES
from gpu.sim.nexus.run import NexusScenario, max_load

PREFIX = linear_profile("trunk", 1.0, 10.0, 64, memory_bytes=1000)
SUFFIX = linear_profile("head", 0.1, 1.0, 64, memory_bytes=10)


def group(m):
    return PrefixGroup("g", PREFIX, SUFFIX, tuple(f"v{j}" for j in range(m)))


def test_merged_profile_runs_the_prefix_once_and_each_suffix_on_its_part():
    merged = group(2).merged_profile([3.0, 1.0])
    assert merged.latency(4) == pytest.approx(PREFIX.latency(4) + SUFFIX.latency(3) + SUFFIX.latency(1))
    assert merged.latency(1) == pytest.approx(PREFIX.latency(1) + SUFFIX.latency(1))
    even = group(2).merged_profile([1.0, 1.0])
    assert even.latency(4) == pytest.approx(PREFIX.latency(4) + 2 * SUFFIX.latency(2))


def test_merged_batch_is_cheaper_than_running_the_variants_apart():
    merged = group(4).merged_profile([1.0] * 4)
    apart = group(4).variant_profile("v0")
    assert merged.latency(32) < 4 * apart.latency(8)


def test_memory_grows_by_one_suffix_per_added_variant():
    mem = [group(m).merged_profile([1.0] * m).memory(8) for m in (1, 2, 3, 4)]
    assert [b - a for a, b in zip(mem, mem[1:])] == [10, 10, 10]
    assert group(1).variant_profile("v0").memory(8) == 1010


def test_merge_sessions_groups_only_variants_with_the_same_slo():
    sessions = [Session("a", "v0", 100, 10), Session("b", "v1", 100, 30), Session("c", "v2", 50, 5),
                Session("d", "other", 100, 7)]
    merged, profiles = merge_sessions(sessions, [group(3)])
    assert [(s.session_id, s.model, s.slo_ms, s.rate) for s in merged] == [
        ("g@100", "g@100", 100, 40), ("c", "v2", 50, 5), ("d", "other", 100, 7)]
    assert set(profiles) == {"g@100"}
    assert profiles["g@100"].latency(4) == pytest.approx(PREFIX.latency(4) + SUFFIX.latency(3) + SUFFIX.latency(1))


def test_prefix_batching_serves_more_variants_on_one_gpu():
    g = group(6)
    profiles = variant_profiles([g], {})
    sc = NexusScenario("pb", "paper", profiles, tuple(Session(f"s{j}", f"v{j}", 100.0, 20.0) for j in range(6)),
                       (), 1, 3.0, "uniform", 1, prefix_groups=(g,))
    with_pb = max_load(sc, STRATEGIES["nexus"], 1, iters=4)
    without = max_load(sc, STRATEGIES["nexus_no_prefix_batching"], 1, iters=4)
    assert with_pb > 1.5 * without > 0


def test_variant_name_clashing_with_a_model_is_a_config_error():
    with pytest.raises(ConfigError, match=r"prefix_groups\.g\.models='v0'"):
        variant_profiles([group(2)], {"v0": PREFIX})


def test_empty_group_is_a_config_error():
    with pytest.raises(ConfigError, match=r"prefix_groups\.g\.models"):
        PrefixGroup("g", PREFIX, SUFFIX, ())
