"""The pool ledger: placement rules, waiting, never-fits, ephemeral resources, sharing and reclaim."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
import threading
import time

import pytest

from gpu.devices import discover, parse_simulated, PoolSpec
from gpu.errors import AllocationTimeout, ConfigError, NeverFitsError, excerpt
from gpu.ledger import PoolLedger
from gpu.placement import ResourceRequest


def pool(spec: str = "2x16GiB", path=None, **kw) -> PoolLedger:
    return PoolLedger(PoolSpec((parse_simulated(spec, "n0", cpus=8),)), path, **kw)


def replay_max_usage(events: list[dict]) -> dict[int, float]:
    """Highest compute share each device ever had, replaying allocate/release events in order."""
    usage: dict[int, float] = {}
    peak: dict[int, float] = {}
    for e in events:
        sign = 1 if e["kind"] == "allocate" else -1
        for d in json.loads(e["devices"]):
            usage[d] = usage.get(d, 0.0) + sign * e["fraction"]
            peak[d] = max(peak.get(d, 0.0), usage[d])
    return peak


def test_fractions_share_one_device_best_fit():
    ledger = pool()
    a = ledger.allocate(ResourceRequest(gpus=0.5))
    b = ledger.allocate(ResourceRequest(gpus=0.25))
    c = ledger.allocate(ResourceRequest(gpus=0.5))
    assert a.devices == b.devices            # best fit packs the partly used device
    assert c.devices != a.devices            # 0.75 used: 0.5 no longer fits there
    assert (a.fraction, b.fraction) == (0.5, 0.25)


def test_whole_gpu_requests_take_idle_devices_and_set_cuda_visible_devices():
    ledger = pool("4x16GiB")
    frac = ledger.allocate(ResourceRequest(gpus=0.1))
    two = ledger.allocate(ResourceRequest(gpus=2))
    assert len(two.devices) == 2 and frac.devices[0] not in two.devices
    assert two.cuda_visible_devices == ",".join(map(str, two.devices))
    with pytest.raises(ConfigError, match="gpus=1.5"):
        ResourceRequest(gpus=1.5)


def test_memory_request_places_by_memory_not_fraction():
    ledger = pool("2x16GiB")
    a = ledger.allocate(ResourceRequest(memory="12GiB"))
    b = ledger.allocate(ResourceRequest(memory="12GiB"))
    assert a.devices != b.devices
    assert a.fraction == pytest.approx(0.75)
    with pytest.raises(AllocationTimeout):
        ledger.allocate(ResourceRequest(memory="8GiB"), timeout=0.05)


def test_pinned_request_lands_on_its_device_and_waits_for_it():
    ledger = pool("2x16GiB")
    first = ledger.allocate(ResourceRequest(gpus=0.5, devices=(1,)))
    assert first.devices == (1,)                      # best fit alone would take device 0
    second = ledger.allocate(ResourceRequest(gpus=0.5, devices=[1]))
    assert second.devices == (1,)
    with pytest.raises(AllocationTimeout):            # device 0 is idle, but the pin forbids it
        ledger.allocate(ResourceRequest(gpus=0.25, devices=(1,)), timeout=0.05)
    with pytest.raises(NeverFitsError, match=r"devices=\[7\]"):
        ledger.allocate(ResourceRequest(gpus=0.5, devices=(7,)))
    with pytest.raises(ConfigError, match="devices"):
        ResourceRequest(gpus=0.5, devices=(1, 1))


def test_request_that_can_never_fit_fails_at_once_naming_request_and_totals():
    ledger = pool("2x16GiB")
    with pytest.raises(NeverFitsError) as err:
        ledger.allocate(ResourceRequest(gpus=4, label="big"))
    assert "big(gpus=4" in str(err.value) and "2 GPU(s) of 16GiB" in str(err.value)
    with pytest.raises(NeverFitsError, match="memory=32GiB"):
        ledger.allocate(ResourceRequest(gpus=0.5, memory="32GiB"))
    assert ledger.waiting() == 0


def test_request_that_fits_later_waits_then_is_placed():
    ledger = pool("1x16GiB")
    held = ledger.allocate(ResourceRequest(gpus=1))
    got = []
    waiter = threading.Thread(target=lambda: got.append(ledger.allocate(ResourceRequest(gpus=0.5), timeout=30)))
    waiter.start()
    deadline = time.monotonic() + 10
    while ledger.waiting() != 1 and time.monotonic() < deadline:  # the waiter's ticket is queued
        waiter.join(0.01)
    assert ledger.waiting() == 1 and not got
    ledger.release(held.lease_id)
    waiter.join(10)
    assert got and got[0].devices == (0,)


def test_fifo_head_blocks_later_requests_unless_backfill():
    from gpu.placement import FifoBestFit

    for backfill, small_first in ((False, False), (True, True)):
        ledger = pool("2x16GiB", policy=FifoBestFit(backfill=backfill))
        held = ledger.allocate(ResourceRequest(gpus=0.5))
        big = ledger.submit(ResourceRequest(gpus=2))
        small = ledger.submit(ResourceRequest(gpus=0.25))
        assert (ledger.try_grant(small) is not None) is small_first
        assert ledger.try_grant(big) is None
        ledger.release(held.lease_id)


def test_ledger_never_overcommits_under_many_threads_and_releases_everything():
    ledger = pool("3x16GiB")
    errors = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(40):
            req = ResourceRequest(gpus=rnd.choice([0.25, 0.5, 1, 2]), memory=rnd.choice([0, "4GiB"]))
            try:
                with ledger.lease(req, timeout=30):
                    for n in ledger.free_state():
                        for d in n.devices:
                            if d.compute_free < -1e-9 or d.memory_free < 0:
                                errors.append(d)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    assert ledger.leases() == [] and ledger.waiting() == 0
    assert max(replay_max_usage(ledger.events()).values()) <= 1 + 1e-9


def test_ephemeral_resources_create_resize_delete_while_held():
    ledger = pool("1x16GiB")
    waiting_for_signal = ledger.submit(ResourceRequest(resources={"signal": 1}))  # ESCHER task signalling
    assert ledger.try_grant(waiting_for_signal) is None                 # not created yet: waits, no error
    ledger.set_resource("signal", 1)
    sig = ledger.try_grant(waiting_for_signal)
    assert sig is not None
    ledger.set_resource("slots", 2)
    a = ledger.allocate(ResourceRequest(resources={"slots": 1}))
    b = ledger.allocate(ResourceRequest(resources={"slots": 1}))
    ledger.set_resource("slots", 1)                                    # shrink below use: holders keep it
    assert ledger.resources()["n0"]["slots"] == (1.0, -1.0)
    ledger.release(a.lease_id)
    with pytest.raises(AllocationTimeout):
        ledger.allocate(ResourceRequest(resources={"slots": 1}), timeout=0.05)
    ledger.release(b.lease_id)
    c = ledger.allocate(ResourceRequest(resources={"slots": 1}), timeout=1)
    ledger.delete_resource("slots")
    assert "slots" not in ledger.resources().get("n0", {})
    ledger.release(c.lease_id)
    ledger.release(sig.lease_id)


@pytest.mark.parametrize("kind", ["file", "memory", "sim"])
def test_a_data_local_task_too_big_for_the_data_node_never_blocks_the_fifo_queue(kind, tmp_path):
    """A mapper needing 4 CPUs where its data lives, on a 2-CPU node: it fits no node as configured (an 8-CPU
    node lacks the data), so under strict FIFO it waits off the head with its own timeout, later requests are
    granted, and it runs once the data is also on the big node."""
    from gpu.sim.escher.ledger import SimLedger

    spec = PoolSpec((parse_simulated("1x16GiB", "small", cpus=2), parse_simulated("1x16GiB", "big", cpus=8)))
    ledger = SimLedger(spec) if kind == "sim" else PoolLedger(spec, tmp_path / "p.sqlite" if kind == "file" else None)
    ledger.set_resource("data-7", 1, "small")
    mapper = ResourceRequest(cpus=4, resources={"data-7": 1}, label="mapper")
    waiting = ledger.submit(mapper)
    assert ledger.allocate(ResourceRequest(gpus=0.5, cpus=2, label="later"), timeout=1).label == "later"
    assert ledger.try_grant(waiting) is None
    with pytest.raises(AllocationTimeout):                      # queued behind it: its own timeout holds
        ledger.allocate(mapper, timeout=0.3)
    ledger.set_resource("data-7", 1, "big")
    assert ledger.try_grant(waiting).node == "big"


_HAMMER = """
import sys
from gpu.devices import PoolSpec, parse_simulated
from gpu.ledger import PoolLedger
from gpu.placement import ResourceRequest
ledger = PoolLedger(PoolSpec((parse_simulated("2x16GiB", "n0", cpus=8),)), sys.argv[1])
for i in range(60):
    with ledger.lease(ResourceRequest(gpus=[0.5, 1, 0.25][i % 3]), timeout=60):
        pass
"""


def test_two_processes_share_one_pool_without_overcommit(tmp_path):
    path = tmp_path / "shared.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", _HAMMER, str(path)]) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    ledger = pool(path=path)
    events = ledger.events()
    assert sum(e["kind"] == "allocate" for e in events) == 120
    assert max(replay_max_usage(events).values()) <= 1 + 1e-9
    assert ledger.leases() == []


_HOLDER = """
import sys
from gpu.devices import PoolSpec, parse_simulated
from gpu.ledger import PoolLedger
from gpu.placement import ResourceRequest
ledger = PoolLedger(PoolSpec((parse_simulated("1x16GiB", "n0", cpus=8),)), sys.argv[1])
p = ledger.allocate(ResourceRequest(gpus=1))
print(p.lease_id, flush=True)
sys.stdin.read()   # hold the lease until killed
"""


def test_lease_of_a_killed_process_is_reclaimed(tmp_path):
    path = tmp_path / "pool.sqlite"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    lease_id = holder.stdout.readline().strip()
    ledger = pool("1x16GiB", path=path)
    assert [p.lease_id for p in ledger.leases()] == [lease_id]
    with pytest.raises(AllocationTimeout):
        ledger.allocate(ResourceRequest(gpus=1), timeout=0.1)
    holder.kill()  # SIGKILL: no cleanup runs in the holder
    placement = ledger.allocate(ResourceRequest(gpus=1), timeout=10)
    assert placement.devices == (0,)
    assert any(e["kind"] == "reclaim" and e["lease_id"] == lease_id for e in ledger.events())
    holder.wait()


def test_no_nvml_falls_back_to_simulated_devices(monkeypatch, caplog):
    import pynvml

    def no_driver():
        raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    with caplog.at_level("INFO", logger="gpuflows.devices"):
        spec = discover("3x8GiB")
    assert spec.simulated and spec.gpu_count == 3
    assert spec.nodes[0].devices[0].memory_total == 8 * 2**30
    assert "simulating 3 device(s) of 8GiB" in caplog.text
    with pytest.raises(ConfigError, match="backend='nvml'"):
        discover("3x8GiB", backend="nvml")


def test_bad_simulated_spec_names_the_value():
    with pytest.raises(ConfigError, match="simulated='four gpus'"):
        parse_simulated("four gpus")


@pytest.mark.parametrize("kwargs,named", [
    (dict(gpus=0.5, cpus=math.nan), "cpus=nan"),
    (dict(gpus=math.inf), "gpus=inf"),
    (dict(gpus=math.nan), "gpus=nan"),
    (dict(memory=math.nan), "memory=nan"),
    (dict(cpus="2"), "cpus='2'"),
    (dict(resources={"bw": "1"}), "resources['bw']='1'"),
    (dict(resources={"bw": math.nan}), "resources['bw']=nan"),
    (dict(resources=["bw"]), "resources=['bw']"),
    (dict(memory="9" * 400 + "GiB"), "memory='999"),
    (dict(memory=10**30), "memory=1000"),
    (dict(label=["a"]), "label=['a']"),
    (dict(node=""), "node=''"),
])
def test_a_request_with_a_non_finite_or_non_numeric_amount_is_refused_naming_it(kwargs, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        ResourceRequest(**kwargs)


def test_a_refused_request_leaves_a_shared_pool_usable(tmp_path):
    # NaN would be stored as NULL by SQLite and break every later grant on the pool, in every process
    ledger = pool("1x16GiB", path=tmp_path / "p.sqlite")
    with pytest.raises(ConfigError):
        ledger.allocate(ResourceRequest(gpus=0.5, cpus=math.nan))
    assert ledger.allocate(ResourceRequest(gpus=0.5)).devices == (0,)
    with pytest.raises(ConfigError, match=r"lease_ttl=inf"):
        pool("1x16GiB", lease_ttl=math.inf)


def test_reopening_a_pool_with_other_devices_while_leased_is_refused(tmp_path):
    path = tmp_path / "p.sqlite"
    first = pool("2x16GiB", path=path)
    first.allocate(ResourceRequest(gpus=1))
    with pytest.raises(ConfigError, match="different device set"):
        pool("4x16GiB", path=path)


def test_a_file_that_is_not_a_ledger_is_named_not_a_sqlite_traceback(tmp_path):
    path = tmp_path / "p.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigError, match=rf"pool={re.escape(excerpt(str(path)))}: is not a pool ledger"):
        pool("1x16GiB", path=path)
