"""FLUID's trials packed onto one device as Salus jobs under PACK (``trial_groups --execution salus-pack``):
real digit-MLP trials share one simulated device, their iterations interleave, every trial ends with its
result (a failing one with its error, the others unharmed), and a bad execution fails before any run."""

from __future__ import annotations

import pytest

from gpu.errors import ConfigError
from resource_blocks import GpuPool

GRID = {"lr": {"grid": [0.05, 0.1, 0.2]}, "hidden": 32, "batch_size": 64}


def sim_pool(name: str) -> GpuPool:
    return GpuPool(name=name, device_backend="simulated", simulated="2x16GiB")


def _order(summary: dict) -> list[str]:
    """Trial ids in the order their iterations started (wall clock, one machine)."""
    return [tid for _, tid in sorted((start, tid) for tid, p in summary["placements"].items()
                                     for start, _ in p["spans"])]


@pytest.mark.usefixtures("prefect_server")
def test_packed_trials_interleave_on_one_device_and_every_trial_finishes(state_dir):
    from flows.trial_groups import trial_groups

    s = trial_groups(algorithm="grid", space=GRID, iterations=4, execution="salus-pack", pool=sim_pool("tg-pack"),
                     mode="thread", tracking=False, progress=False, fail_trial="c0001@0")
    assert s["execution"] == "salus-pack" and s["trials"] == 3
    assert s["failures"] == ["c0001@0"] and "injected failure" in s["errors"]["c0001@0"]
    done = {"c0000@0", "c0002@0"}
    assert set(s["placements"]) == done
    for tid in done:
        placed = s["placements"][tid]
        assert placed["devices"] == [0] and len(placed["spans"]) == 4  # the pool's first device, every iteration
        assert 0.0 <= s["scores"][tid] < 0.5  # trained: validation accuracy above 0.5
    assert s["lanes"] >= 2 and len({s["placements"][t]["lane"] for t in done}) == 2  # PACK: a lane each
    order = _order(s)
    assert sum(a != b for a, b in zip(order, order[1:])) >= 2  # interleaved, not one trial after the other
    assert s["best_trial"] in done and s["iterations_trained"] == 8
    assert sim_pool("tg-pack").open_ledger().leases() == []  # every trial's lease was given back


def test_salus_pack_is_a_choice_of_execution_and_a_bad_one_fails_before_any_run(state_dir, capsys):
    from flows.trial_groups import main, prepare

    args = dict(algorithm="grid", trials=4, iterations=2, seed=0, space=None, min_iterations=1, generations=2, c=None,
                d=None, alpha=None, chunk=2, mode="thread", packing_iterations=10, fail_trial=None)
    assert prepare(sim_pool("tg-pack-check"), False, execution="salus-pack", **args)[2].devices
    with pytest.raises(ConfigError, match=r"^execution='salus'.*salus-pack"):
        prepare(sim_pool("tg-pack-check"), False, execution="salus", **args)
    assert main(["--execution", "salus", "--no-tracking", "--mode", "thread"]) == 2
    assert "execution='salus'" in capsys.readouterr().err
