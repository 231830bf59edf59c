"""The ledger stress benchmark's checkers: silent on a correct run, and each one able to fail."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest

from benchmarks.ledger_stress import (
    capacities, fifo_inversions, load_pool, new_ledger, overcommit, replay, run_phase, _sampler,
)

GIB = 2**30
CAPS = capacities(load_pool())
RES_CAPS = {("n0", "license"): 1.0, ("n1", "license"): 1.0, ("n1", "token"): 2.0}


def interval(t0, t1, node="n0", devices=(0,), fraction=0.5, memory=0, cpus=0.0, resources=None, label="x"):
    return {"label": label, "t_got": t0, "t_rel": t1, "node": node, "devices": list(devices), "fraction": fraction,
            "memory": memory, "cpus": cpus, "resources": resources or {}}


def test_overcommit_names_each_capacity():
    full = [("n0", [0], 0.5, 8 * GIB, 4, {"license": 1}), ("n0", [0], 0.5, 8 * GIB, 4, {})]
    assert overcommit(full, CAPS, RES_CAPS) == []  # exactly at capacity is fine
    found = overcommit([("n0", [0], 0.75, 10 * GIB, 6, {"license": 1}),
                        ("n0", [0], 0.5, 8 * GIB, 8, {"license": 1}), ("n1", [], 0, 0, 0, {"nothere": 1}),
                        ("n0", [9], 0.1, 0, 0, {})], CAPS, RES_CAPS)
    assert any("gpu0 compute" in f for f in found) and any("gpu0 memory" in f for f in found)
    assert any("n0 cpus" in f for f in found) and any("n0 license" in f for f in found)
    assert any("nothere" in f for f in found) and any("gpu9 memory" in f for f in found)  # unknown device / resource


def test_replay_detects_overlap_and_allows_handover():
    ok = [interval(0.0, 1.0, fraction=1.0), interval(1.0, 2.0, fraction=1.0),
          interval(0.5, 1.5, devices=(1,), fraction=1.0)]
    assert replay(ok, CAPS, RES_CAPS) == []  # released at the instant the next one is granted: no overlap
    bad = ok + [interval(1.9, 3.0, fraction=0.25, label="double")]
    found = replay(bad, CAPS, RES_CAPS)
    assert len(found) == 1 and "double" in found[0] and "n0:gpu0 compute 1.250" in found[0]
    assert replay([interval(0, 1, node="n1", devices=(), fraction=0, resources={"token": 1}),
                   interval(0.5, 2, node="n1", devices=(), fraction=0, resources={"token": 2})], CAPS, RES_CAPS)


def grant(label, shape, t_call, granted_at, timeout=5.0):
    return {"kind": "grant", "label": label, "shape": shape, "t_call": t_call, "granted_at": granted_at,
            "timeout": timeout}


def test_fifo_inversions_only_when_provably_queued_first():
    # a (ticket 1) waits; b (ticket 2, same shape) is granted before it: an inversion of 1 s
    records = [grant("a", "s", 0.0, 2.0), grant("b", "s", 0.1, 1.0)]
    assert fifo_inversions(records, {"a": (1, 0.01), "b": (2, 0.11)}) == [("a", "b", 1.0)]
    assert fifo_inversions(records, {"a": (2, 0.01), "b": (1, 0.11)}) == []  # b was queued first
    other_shape = [grant("a", "s", 0.0, 2.0), grant("b", "t", 0.1, 1.0)]
    assert fifo_inversions(other_shape, {"a": (1, 0.01), "b": (2, 0.11)}) == []
    # b granted at once (never seen waiting): an inversion only if a's ticket existed before b's call
    assert len(fifo_inversions(records, {"a": (1, 0.01)})) == 1
    assert fifo_inversions([grant("a", "s", 0.0, 2.0), grant("b", "s", 0.005, 1.0)], {"a": (1, 0.01)}) == []
    # a timed out at 0 + 3 s; b granted at 1 s while a still waited
    timed_out = {"kind": "timeout", "label": "a", "shape": "s", "t_call": 0.0, "timeout": 3.0}
    assert len(fifo_inversions([timed_out, grant("b", "s", 0.1, 1.0)], {"a": (1, 0.01)})) == 1
    assert fifo_inversions([timed_out, grant("b", "s", 0.1, 3.5)], {"a": (1, 0.01)}) == []
    # a's grant came before b's, but a's thread woke past its deadline: the ledger withdrew it, a did not wait
    assert fifo_inversions([timed_out, grant("b", "s", 0.1, 1.0)], {"a": (1, 0.01)}, {"a": 7, "b": 8}) == []
    assert len(fifo_inversions([timed_out, grant("b", "s", 0.1, 1.0)], {"a": (1, 0.01)}, {"a": 9, "b": 8})) == 1


def test_sampler_reads_the_file_read_only_and_finds_an_overcommit(tmp_path):
    path = tmp_path / "pool.sqlite"
    res_caps = new_ledger(path, load_pool())
    db = sqlite3.connect(path)
    row = "INSERT INTO leases (id, node, devices, fraction, memory, cpus, resources) VALUES (?,?,?,?,?,?,?)"
    db.execute(row, ("l1", "n1", "[1]", 0.75, 0, 0, json.dumps({"license": 1})))
    db.execute(row, ("l2", "n1", "[1]", 0.5, 0, 0, json.dumps({"license": 1})))
    db.execute("INSERT INTO tickets (request, created_at) VALUES (?, ?)", (json.dumps({"label": "w"}), 1.5))
    db.commit()
    stop = threading.Event()
    sampler = threading.Thread(target=_sampler,
                               args=(str(path), capacities(load_pool()), stop, str(tmp_path / "s.json"), 0.01))
    sampler.start()
    threading.Timer(0.2, stop.set).start()
    sampler.join(10)
    out = json.loads((tmp_path / "s.json").read_text())
    assert out["samples"] > 0 and out["errors"] == 0 and res_caps[("n1", "license")] == 1.0
    assert out["violations"] and "n1:gpu1 compute 1.250 > 1" in out["violations"][0]
    assert out["seen"] == {"w": [1, 1.5]}


@pytest.mark.slow
def test_short_phase_is_clean_and_its_replay_catches_an_injected_double_grant(tmp_path):
    phase = run_phase(8, 2.0, 4, tmp_path, timeout=(2.0, 2.0))
    assert phase["grants"] > 20 and phase["samples"] > 10 and phase["errors"] == 0 and phase["stuck"] == 0
    assert phase["sampled_violations"] == [] and phase["replay_violations"] == []
    grants = [r for r in phase["records"] if r["kind"] == "grant"]
    assert replay(grants, phase["caps"], phase["res_caps"]) == []
    # a whole GPU handed out a second time while a real grant on it was held
    real = next(r for r in grants if r["devices"])
    forged = {**real, "label": "forged", "fraction": 1.0, "t_got": (real["t_got"] + real["t_rel"]) / 2}
    found = replay(grants + [forged], phase["caps"], phase["res_caps"])
    assert found and any("compute" in f for f in found)
