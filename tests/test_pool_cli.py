"""`gpuflows pool`: a pool opens with the layout its ledger stores, an unknown name is an error, `--list` lists them."""

from __future__ import annotations

from gpu.pool import open_pool, pool_names, read_pool
from gpu.placement import ResourceRequest
from gpuflows.cli import main


def test_looking_at_an_idle_pool_keeps_its_layout(state_dir, capsys):
    open_pool("big", simulated="4x8GiB").close()
    assert main(["pool", "--name", "big"]) == 0
    out = capsys.readouterr().out
    assert "gpu3: compute 1.00 free, memory 8GiB/8GiB free" in out and "16GiB" not in out
    assert ": 4 x 8GiB, " in read_pool("big").layout()


def test_a_misspelt_pool_name_is_an_error_listing_the_pools_and_creates_nothing(state_dir, capsys):
    open_pool("big", simulated="4x8GiB").close()
    assert main(["pool", "--name", "bgi"]) == 2
    err = capsys.readouterr().err
    assert "pool='bgi': no such pool; the pools here are ['big']" in err and "Traceback" not in err
    assert pool_names() == ["big"]


def test_the_pool_list_shows_layouts_and_leases(state_dir, capsys):
    assert main(["pool", "--list"]) == 0
    assert "no pools yet" in capsys.readouterr().out
    ledger = open_pool("demo", simulated="2x16GiB")
    lease = ledger.allocate(ResourceRequest(gpus=0.5), timeout=5)
    open_pool("big", simulated="4x8GiB").close()
    assert main(["pool", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["big", "demo"]
    assert "4 x 8GiB" in lines[0] and "0 lease(s), 0 waiting" in lines[0]
    assert "2 x 16GiB" in lines[1] and "1 lease(s), 0 waiting" in lines[1]
    ledger.release(lease.lease_id)
    ledger.close()
