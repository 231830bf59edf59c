"""Pool ledger under load: many processes x threads on one SQLite ledger file.

Each phase starts ``clients`` client threads (``--threads`` per spawned process, one ``PoolLedger`` per
process, as a Prefect worker has) on a fresh ledger file over a two-node simulated pool with ephemeral
resources. Every thread loops ``allocate -> hold 5-40 ms -> release`` for ``--duration`` seconds with a
random 2-4 s timeout, drawing from a fixed mix of request shapes (fractions, memory, whole GPUs, CPUs,
resources, node and device pins; ``SHAPES``). Measured per phase, for 16, 48, 96 and 192 clients:

- grants/s (grants returned inside the phase window), p50/p99 grant latency (allocate call to return) and
  util, the share of the pool's GPU compute the clients held (from their recorded intervals). The pool is
  small, so 16 clients already queue and every phase is bounded by the pool, not by the clients' demand.
  Target: grants/s at 192 clients >= 0.8 x grants/s at 16 (the ledger must not collapse under queueing);
- timeout overrun: how late ``allocate`` returned past its timeout, whether it raised AllocationTimeout
  or returned a grant too late (the caller asked to wait no longer), and for threads still stuck in a
  ledger call 5 s after the phase (SIGTERMed; a lower bound). Target: 100 ms; "late" counts those over.
  Beside it, "wake ms": how late a thread of the idle driver process woke from 20 ms sleeps during the
  phase, the machine's own share of any overrun (a waiter cannot return before it is woken; on a busy
  2-core machine this alone exceeded 300 ms);
- invariant violations (target 0), from two checkers that share no code with the ledger:
  a sampler process opening the file read-only (``mode=ro``), reading ``leases`` and ``resources`` in one
  snapshot every 20 ms and summing per device compute <= 1 and memory <= device memory, per node CPUs and
  each resource <= capacity; and a replay, after the phase, of every grant interval the clients recorded.
  A recorded interval runs from ``allocate`` returning to ``release`` being called, so it lies inside the
  ledger's own grant..release: any overlap over capacity in the replay is a real double grant, including
  the short ones the sampler misses between two snapshots;
- FIFO violations (target 0; the default policy is FIFO without backfill). An inversion is a pair of
  requests of the same shape where T1 was certainly queued before T2 and T2 was granted while T1 still
  waited. "Certainly queued before": the sampler saw T1's ticket (found by its unique label in the
  ``tickets`` table) and either saw T2's ticket with a larger id, or T1's ``created_at`` precedes the
  moment T2's ``allocate`` was called. Submit times taken by the clients alone would not do: a client waits
  an unbounded time for SQLite's write lock before its ticket exists. "Still waited": T2's
  ``Placement.granted_at`` (stamped inside the serialised grant transaction) is before T1's, or before
  T1's deadline when T1 timed out, unless T1's grant was logged before T2's: a T1 granted just before its
  deadline whose thread woke too late to take it (the ledger withdraws such a grant: "request withdrawn")
  did not wait behind T2. Same shape, so if T2 fits so did T1. A request granted at once is never
  seen waiting and can only be the T2 of a pair; ``tickets_seen_N`` says how many tickets were observed;
- kill -9: a process holds the only GPU of a one-GPU pool, 8 waiters queue for it, the holder is killed;
  reclaim time is the kill to the first waiter's ``allocate`` returning. Target 1 s.

Usage: ``python benchmarks/ledger_stress.py [--quick] [--json OUT] [--clients 16,48] [--duration S]``.
"""

from __future__ import annotations

import bisect
import json
import multiprocessing as mp
import os
import queue
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Iterable

from benchmarks.cli import benchmark_parser, write_json
from benchmarks.paper_table import Row, judged, paper_table
from gpu.devices import PoolSpec, parse_simulated
from gpu.errors import AllocationTimeout
from gpu.ledger import PoolLedger
from gpu.placement import ResourceRequest

CLIENTS = (16, 48, 96, 192)
EPS = 1e-6          # slack on sums of fractions and CPUs
CLOCK_EPS = 0.001   # every timestamp is time.time() on this one host; 1 ms against clock steps
GRACE_S = 5.0       # after the last possible deadline, threads still inside the ledger are stuck
OVERRUN_TARGET_MS, RECLAIM_TARGET_S, RATIO_TARGET = 100.0, 1.0, 0.8
# The pool is small on purpose: 16 clients already keep it full (mean demand ~0.4 GPU each, 6 GPUs' worth),
# so grants/s is bounded by the pool at every client count and a drop at 192 is the ledger's own doing.
NODES, NODE_GPUS, NODE_CPUS = ("n0", "n1"), "2x16GiB", 8
# name: (weight, ResourceRequest keywords); "license" 1 per node, "token" 2 on n1.
SHAPES: dict[str, tuple[int, dict]] = {
    "frac25": (20, {"gpus": 0.25}), "frac50": (15, {"gpus": 0.5}), "mem4g": (10, {"memory": "4GiB"}),
    "gpu1": (8, {"gpus": 1}), "gpu2": (4, {"gpus": 2, "memory": "8GiB"}), "cpu4": (10, {"cpus": 4}),
    "license": (10, {"gpus": 0.25, "cpus": 1, "resources": {"license": 1}}),
    "node_n1": (8, {"gpus": 0.5, "node": "n1"}), "dev_n0_1": (8, {"gpus": 0.25, "node": "n0", "devices": (1,)}),
    "token": (7, {"resources": {"token": 1}, "node": "n1"}),
}
RESOURCES = (("license", 1.0, None), ("token", 2.0, "n1"))


def load_pool() -> PoolSpec:
    return PoolSpec(tuple(parse_simulated(NODE_GPUS, n, cpus=NODE_CPUS) for n in NODES))


def kill_pool() -> PoolSpec:
    return PoolSpec((parse_simulated("1x16GiB", "k0", cpus=4),))


def capacities(spec: PoolSpec) -> dict:
    return {"memory": {(n.name, d.index): d.memory_total for n in spec.nodes for d in n.devices},
            "cpus": {n.name: n.cpus for n in spec.nodes}}


# -- checkers (independent of gpu.ledger) --------------------------------------------------------
def overcommit(holdings: Iterable[tuple], caps: dict, res_caps: dict) -> list[str]:
    """What ``holdings`` (node, devices, fraction, memory, cpus, resources) exceed, summed from scratch."""
    frac, mem, cpu, res = (defaultdict(float) for _ in range(4))
    for node, devices, fraction, memory, cpus, resources in holdings:
        for d in devices:
            frac[node, d] += fraction
            mem[node, d] += memory
        cpu[node] += cpus or 0.0
        for k, v in (resources or {}).items():
            res[node, k] += v
    bad = [f"{n}:gpu{d} compute {v:.3f} > 1" for (n, d), v in frac.items() if v > 1 + EPS]
    bad += [f"{n}:gpu{d} memory {v:.0f} > {caps['memory'].get((n, d), 0)}" for (n, d), v in mem.items()
            if v > caps["memory"].get((n, d), 0) or (n, d) not in caps["memory"]]
    bad += [f"{n} cpus {v:g} > {caps['cpus'].get(n, 0):g}" for n, v in cpu.items() if v > caps["cpus"].get(n, 0) + EPS]
    bad += [f"{n} {k} {v:g} > {res_caps.get((n, k), 0):g}" for (n, k), v in res.items()
            if v > res_caps.get((n, k), 0) + EPS]
    return bad


def replay(intervals: list[dict], caps: dict, res_caps: dict) -> list[str]:
    """Over-commits in time: sweep the recorded [t_got, t_rel] intervals (ends before starts at a tie)."""
    events = sorted([e for i, r in enumerate(intervals) for e in ((r["t_got"], 1, i), (r["t_rel"], 0, i))])
    active: dict[int, tuple] = {}
    bad = []
    for t, start, i in events:
        if not start:
            active.pop(i, None)
            continue
        r = intervals[i]
        active[i] = (r["node"], r["devices"], r["fraction"], r["memory"], r.get("cpus", 0), r.get("resources"))
        found = overcommit(active.values(), caps, res_caps)
        if found:
            bad.append(f"t={t:.3f} granting {r.get('label')}: {'; '.join(found)}")
    return bad


def fifo_inversions(records: list[dict], seen: dict[str, tuple],
                    logged: dict[str, int] | None = None) -> list[tuple[str, str, float]]:
    """(earlier, overtaking, lag s) pairs of same-shape requests; see the module docstring. ``logged``: each
    label's position in the ledger's log of grants (its ``events`` table), for requests that timed out."""
    logged = logged or {}
    out = []
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["kind"] == "grant":
            groups[r["shape"]].append(r)
    for g in groups.values():
        g.sort(key=lambda r: r["granted_at"])
    keys = {s: [r["granted_at"] for r in g] for s, g in groups.items()}
    for t1 in records:
        if t1["label"] not in seen or t1["kind"] not in ("grant", "timeout"):
            continue
        id1, ins1 = seen[t1["label"]]
        end1 = t1["granted_at"] if t1["kind"] == "grant" else t1["t_call"] + t1["timeout"]
        g, k = groups.get(t1["shape"], []), keys.get(t1["shape"], [])
        for t2 in g[bisect.bisect_right(k, ins1):bisect.bisect_left(k, end1 - CLOCK_EPS)]:
            id2 = seen.get(t2["label"], (None,))[0]
            before = id1 < id2 if id1 is not None and id2 is not None else ins1 + CLOCK_EPS < t2["t_call"]
            granted_first = t1["label"] in logged and logged[t1["label"]] < logged.get(t2["label"], -1)
            if before and t2 is not t1 and not granted_first:
                out.append((t1["label"], t2["label"], end1 - t2["granted_at"]))
    return out


def _sampler(path: str, caps: dict, stop, out: str, interval: float) -> None:
    """Read-only snapshots of the ledger file: capacity checks, and each waiting ticket's id and insert time."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=10)
    samples, errors, bad, seen, last_id, tickets_ok = 0, 0, [], {}, -1, True
    while not stop.wait(interval):
        try:
            db.execute("BEGIN")
            leases = db.execute("SELECT node, devices, fraction, memory, cpus, resources FROM leases").fetchall()
            res_caps = {(n, k): c for n, k, c in db.execute("SELECT node, name, capacity FROM resources")}
            tickets = []
            if tickets_ok:
                try:
                    tickets = db.execute("SELECT id, request, created_at FROM tickets WHERE id > ?",
                                         (last_id,)).fetchall()
                except sqlite3.OperationalError:  # another schema: FIFO cannot be checked
                    tickets_ok = False
            db.execute("COMMIT")
        except sqlite3.Error:
            errors += 1
            if db.in_transaction:
                db.execute("ROLLBACK")
            continue
        samples += 1
        found = overcommit(((n, json.loads(d), f, m, c, json.loads(r)) for n, d, f, m, c, r in leases), caps, res_caps)
        if found:
            bad.append(f"t={time.time():.3f} {len(leases)} leases: {'; '.join(found)}")
        for tid, request, created in tickets:
            seen[json.loads(request).get("label", "")] = (tid, created)
            last_id = max(last_id, tid)
    Path(out).write_text(json.dumps({"samples": samples, "errors": errors, "violations": bad, "seen": seen}))


# -- clients ---------------------------------------------------------------------------------------
def _client(proc: int, cfg: dict, spec: PoolSpec, start, t0, ready) -> None:
    """``cfg['threads']`` threads looping allocate/hold/release on one ledger; a JSON line per request."""
    ledger = PoolLedger(spec, cfg["path"])
    fd = os.open(Path(cfg["dir"]) / f"client-{proc}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    inflight: dict[int, dict] = {}

    def write(rec: dict) -> None:
        os.write(fd, (json.dumps(rec) + "\n").encode())  # one O_APPEND write per line: no lock

    def stuck(*_: Any) -> None:  # SIGTERM from the driver: still inside a ledger call
        now = time.time()
        for rec in list(inflight.values()):
            write({**rec, "kind": "stuck", "t_ret": now})
        os._exit(3)

    signal.signal(signal.SIGTERM, stuck)
    names = list(cfg["shapes"])
    weights = [SHAPES[n][0] for n in names]

    def loop(i: int) -> None:
        rng = random.Random(f"{cfg['seed']}-{proc}-{i}")
        t_start = t0.value
        time.sleep(max(0.0, t_start - time.time()))
        seq = 0
        while time.time() < t_start + cfg["duration"]:
            shape = rng.choices(names, weights)[0]
            label = f"{proc}.{i}.{seq}"
            seq += 1
            rec = inflight[i] = {"label": label, "shape": shape, "timeout": rng.uniform(*cfg["timeout"]),
                                 "stage": "allocate", "t_call": time.time()}
            try:
                p = ledger.allocate(ResourceRequest(**SHAPES[shape][1], label=label), timeout=rec["timeout"])
            except Exception as exc:
                kind = "timeout" if isinstance(exc, AllocationTimeout) else "error"
                write({**rec, "kind": kind, "t_ret": time.time(), "error": f"{type(exc).__name__}: {exc}"[:200]})
                inflight.pop(i)
                time.sleep(0.01 if kind == "error" else 0)
                continue
            rec.update(t_got=time.time(), granted_at=p.granted_at, node=p.node, devices=list(p.devices),
                       fraction=p.fraction, memory=p.memory, cpus=p.cpus, resources=dict(p.resources))
            time.sleep(rng.uniform(*cfg["hold"]))
            rec.update(stage="release", t_rel=time.time())
            try:
                ledger.release(p.lease_id)
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
            write({**rec, "kind": "grant", "t_ret": time.time()})
            inflight.pop(i)
            if cfg["once"]:
                return

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(cfg["threads"])]
    ready.put(proc + 1)
    start.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.close(fd)


def _holder(path: str, spec: PoolSpec, q) -> None:
    p = PoolLedger(spec, path).allocate(ResourceRequest(gpus=1, label="holder"), timeout=30)
    q.put((time.time(), p.to_dict()))
    time.sleep(3600)  # until kill -9


def _wake_lateness(stop: threading.Event, out: list[float], interval: float = 0.02) -> None:
    """Append how late each ``interval`` sleep of this thread woke, until ``stop``: the scheduler's delay."""
    while not stop.is_set():
        t = time.monotonic()
        if stop.wait(interval):
            return
        out.append(time.monotonic() - t - interval)


# -- driver ----------------------------------------------------------------------------------------
def new_ledger(path: Path, spec: PoolSpec, resources=RESOURCES) -> dict:
    ledger = PoolLedger(spec, path)
    for name, cap, node in resources:
        ledger.set_resource(name, cap, node)
    ledger.close()
    return {(n.name, name): cap for n in spec.nodes for name, cap, node in resources if node in (None, n.name)}


def run_phase(clients: int, duration: float, threads: int, root: Path, seed: int = 0, spec: PoolSpec | None = None,
              shapes: Iterable[str] = tuple(SHAPES), timeout=(2.0, 4.0), hold=(0.005, 0.04), once: bool = False,
              resources=RESOURCES, kill_after: float | None = None) -> dict[str, Any]:
    """One phase on a fresh ledger file in ``root``: its records, sampler output and figures. With
    ``kill_after``, a holder process takes a whole GPU first and is killed that long after the start."""
    spec = spec or load_pool()
    folder = root / f"phase-{clients}-{time.time_ns()}"
    folder.mkdir(parents=True)
    path = folder / "pool.sqlite"
    res_caps, caps = new_ledger(path, spec, resources), capacities(spec)
    ctx = mp.get_context("spawn")
    start, stop, ready, t0 = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Value("d", 0.0)
    sampler = ctx.Process(target=_sampler, args=(str(path), caps, stop, str(folder / "sampler.json"), 0.02))
    sampler.start()
    if kill_after is not None:
        holder = ctx.Process(target=_holder, args=(str(path), spec, ready))
        holder.start()
        holder_got, placement = ready.get(timeout=60)
    cfg = {"path": str(path), "dir": str(folder), "duration": duration, "seed": seed, "shapes": list(shapes),
           "timeout": timeout, "hold": hold, "once": once}
    procs = [ctx.Process(target=_client, args=(p, {**cfg, "threads": min(threads, clients - p * threads)}, spec,
                                               start, t0, ready)) for p in range(-(-clients // threads))]
    for p in procs:
        p.start()
    waiting_for = len(procs)
    while waiting_for:  # a client that died while starting fails the phase now, not after a long wait
        try:
            waiting_for -= bool(ready.get(timeout=1))
        except queue.Empty:
            if any(p.exitcode is not None for p in procs):
                stop.set()
                raise RuntimeError(f"a client process exited while starting (exit codes {[p.exitcode for p in procs]})")
    t0.value = time.time() + 0.05
    start.set()
    lateness: list[float] = []
    probe_stop = threading.Event()
    probe = threading.Thread(target=_wake_lateness, args=(probe_stop, lateness), daemon=True)
    probe.start()
    kill = None
    if kill_after is not None:
        time.sleep(max(0.0, t0.value + kill_after - time.time()))
        t_kill = time.time()
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
        kill = {"t_kill": t_kill,
                "holder_interval": {**placement, "label": "holder", "t_got": holder_got, "t_rel": t_kill}}
    deadline = t0.value + duration + timeout[1] + GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            p.terminate()  # SIGTERM: the client writes down what its threads are stuck in
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    stop.set()
    probe_stop.set()
    probe.join()
    sampler.join(30)
    sampled = json.loads((folder / "sampler.json").read_text())
    records = [json.loads(line) for f in sorted(folder.glob("client-*.jsonl")) for line in f.read_text().splitlines()]
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:  # where a timed-out request was granted
        sampled["logged"] = {label: i for i, label in db.execute("SELECT id, label FROM events WHERE kind='allocate'")}
    return {"clients": clients, "processes": len(procs), "records": records, "kill": kill, "caps": caps,
            "res_caps": res_caps, "wake_late_ms_max": 1000 * max(lateness, default=0.0),
            **figures(records, sampled, caps, res_caps, t0.value, duration, kill)}


def figures(records, sampled, caps, res_caps, t0, duration, kill) -> dict[str, Any]:
    grants = [r for r in records if r["kind"] == "grant"]
    intervals = grants + [r for r in records if r["kind"] == "stuck" and r["stage"] == "release"]
    if kill:
        intervals.append(kill["holder_interval"])
    lat = sorted(r["t_got"] - r["t_call"] for r in grants if t0 <= r["t_call"] <= t0 + duration)
    # how late allocate returned past its timeout, either way: granted, timed out, or still stuck at the end
    overrun = [r.get("t_got", r["t_ret"]) - r["t_call"] - r["timeout"] for r in records if r["kind"] != "error"]
    seen = {k: tuple(v) for k, v in sampled["seen"].items()}
    replayed = replay(intervals, caps, res_caps)
    held = sum(r["fraction"] * len(r["devices"]) * max(0.0, min(r["t_rel"], t0 + duration) - max(r["t_got"], t0))
               for r in grants)
    pct = (lambda q: 1000 * lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None)
    return {"grants": len(grants), "grants_per_s": sum(t0 <= r["t_got"] <= t0 + duration for r in grants) / duration,
            "gpu_util": held / (len(caps["memory"]) * duration), "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "timeouts": sum(r["kind"] == "timeout" for r in records),
            "timeout_overrun_ms_max": 1000 * max([0.0, *overrun]),
            "late_returns": sum(o > OVERRUN_TARGET_MS / 1000 for o in overrun),
            "errors": sum(r["kind"] == "error" or "error" in r and r["kind"] == "grant" for r in records),
            "stuck": sum(r["kind"] == "stuck" for r in records),
            "fifo": fifo_inversions(records, seen, sampled.get("logged")),
            "sampled_violations": sampled["violations"], "replay_violations": replayed,
            "samples": sampled["samples"], "tickets_seen": len(seen)}


def kill_phase(root: Path, waiters: int = 8, threads: int = 4, seed: int = 0) -> dict[str, Any]:
    """The holder of a one-GPU pool is killed with SIGKILL 1 s after ``waiters`` queued for its GPU."""
    phase = run_phase(waiters, 0.5, threads, root, seed, kill_pool(), ("gpu1",), (15.0, 15.0), (0.01, 0.01), True,
                      (), kill_after=1.0)
    t_kill = phase["kill"]["t_kill"]
    got = sorted(r["t_got"] for r in phase["records"] if r["kind"] == "grant")
    early = [t for t in got if t < t_kill]  # granted while the holder lived: a double grant
    phase["replay_violations"] += [f"waiter granted {t_kill - t:.3f}s before the holder died" for t in early]
    phase["reclaim_s"] = got[0] - t_kill if got and not early else None
    phase["waiters_granted"], phase["clients"] = len(got), "kill -9"
    return phase


def run(clients: Iterable[int], duration: float, threads: int, seed: int, log: Callable[[str], None] = print,
        keep: Path | None = None) -> dict[str, Any]:
    t_start = time.perf_counter()
    root = keep or Path(tempfile.mkdtemp(prefix="gpuflows-stress-"))
    out: dict[str, Any] = {"duration_s": duration, "threads_per_process": threads, "cpus": os.cpu_count()}
    try:
        phases = []
        for n in clients:
            ph = run_phase(n, duration, threads, root, seed)
            phases.append(ph)
            log(f"  {n:>4} clients: {ph['grants_per_s']:8.1f} grants/s, {ph['timeouts']} timeouts, "
                f"{len(ph['fifo'])} FIFO inversions; {ph['samples']} samples, {ph['tickets_seen']} tickets seen "
                f"({time.perf_counter() - t_start:.0f}s)")
        kp = kill_phase(root, seed=seed)
        log(f"  kill -9: reclaim {kp['reclaim_s']} s, {kp['waiters_granted']}/8 waiters granted")
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    for ph in phases:
        n = ph["clients"]
        for key in ("grants_per_s", "p50_ms", "p99_ms", "timeouts", "late_returns", "timeout_overrun_ms_max",
                    "wake_late_ms_max", "errors", "stuck", "samples", "tickets_seen", "processes", "grants", "gpu_util"):
            out[f"{key}_{n}"] = ph[key]
        out[f"fifo_violations_{n}"] = len(ph["fifo"])
        out[f"fifo_max_lag_ms_{n}"] = 1000 * max((lag for *_, lag in ph["fifo"]), default=0.0)
        out[f"invariant_violations_{n}"] = len(ph["sampled_violations"]) + len(ph["replay_violations"])
    for ph in phases + [kp]:  # a few examples of each kind of violation, for whoever fixes them
        for what, found in (("sampled", ph["sampled_violations"]), ("replayed", ph["replay_violations"]),
                            ("FIFO (earlier, overtaking, lag s)", ph["fifo"])):
            for example in found[:3]:
                log(f"  {ph['clients']} clients, {what}: {example}")
    lo, hi = min(clients), max(clients)
    out[f"throughput_ratio_{hi}_vs_{lo}"] = out[f"grants_per_s_{hi}"] / max(out[f"grants_per_s_{lo}"], 1e-9)
    out["reclaim_s"], out["kill_waiters_granted"] = kp["reclaim_s"], kp["waiters_granted"]
    out["timeout_overrun_ms_max"] = max([ph["timeout_overrun_ms_max"] for ph in phases + [kp]])
    out["wake_late_ms_max"] = max([ph["wake_late_ms_max"] for ph in phases + [kp]])
    out["fifo_violations"] = sum(len(ph["fifo"]) for ph in phases + [kp])
    out["invariant_violations"] = sum(len(ph["sampled_violations"]) + len(ph["replay_violations"])
                                      for ph in phases + [kp])
    out["wall_s"] = time.perf_counter() - t_start
    return out


def _checked(name: str, violations: int, watched: bool, unchecked: str) -> Row:
    """A count whose target is 0, judged only where its checker saw the ledger (else not judged, and why)."""
    if not watched:
        return Row(name, str(violations), "target 0", None, unchecked)
    return judged(name, str(violations), "target 0", violations == 0,
                  "a double grant or an inversion: a bug (per-phase table above)")


def format_table(r: dict[str, Any], clients: list[int]) -> str:
    f = lambda v, spec="8.1f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = [f"{'clients':>7} {'procs':>5} {'grants/s':>9} {'util':>5} {'p50 ms':>8} {'p99 ms':>8} {'timeouts':>8} "
             f"{'late':>5} {'overrun ms':>10} {'wake ms':>7} {'FIFO inv':>8} {'invariant':>9} {'errors':>6} {'stuck':>5}"]
    for n in clients:
        lines.append(f"{n:>7} {r[f'processes_{n}']:>5} {f(r[f'grants_per_s_{n}'], '9.1f')} {r[f'gpu_util_{n}']:>5.0%} "
                     f"{f(r[f'p50_ms_{n}'])} {f(r[f'p99_ms_{n}'])} {r[f'timeouts_{n}']:>8} {r[f'late_returns_{n}']:>5} "
                     f"{f(r[f'timeout_overrun_ms_max_{n}'], '10.0f')} {f(r[f'wake_late_ms_max_{n}'], '7.0f')} "
                     f"{r[f'fifo_violations_{n}']:>8} "
                     f"{r[f'invariant_violations_{n}']:>9} {r[f'errors_{n}']:>6} {r[f'stuck_{n}']:>5}")
    lo, hi = min(clients), max(clients)
    ratio = r[f"throughput_ratio_{hi}_vs_{lo}"]
    # where the sampler could not read the ledger's tables (or saw no ticket wait), 0 means unchecked, not passed
    watched = lambda key: all(r[f"{key}_{n}"] > 0 for n in clients)  # noqa: E731
    wake = f"this machine woke an idle thread up to {r['wake_late_ms_max']:.0f} ms late (wake ms)"
    unchecked = "the sampler read no ledger tables (or saw no ticket wait): 0 means unchecked"
    checks = [
        judged(f"grants/s {hi} / {lo} clients", f(ratio, ".3g"), f"target >= {RATIO_TARGET}",
               ratio >= RATIO_TARGET, "the pool's grants fell as clients queued"),
        judged("timeout overrun max (ms)", f(r["timeout_overrun_ms_max"], ".3g"),
               f"target <= {OVERRUN_TARGET_MS:g}", r["timeout_overrun_ms_max"] <= OVERRUN_TARGET_MS,
               wake),
        _checked("FIFO violations", r["fifo_violations"], watched("tickets_seen"), unchecked),
        _checked("invariant violations", r["invariant_violations"], watched("samples"), unchecked),
        judged("reclaim after kill -9 (s)", f(r["reclaim_s"], ".3g"), f"target <= {RECLAIM_TARGET_S:g}",
               r["reclaim_s"] is not None and r["reclaim_s"] <= RECLAIM_TARGET_S,
               "no waiter granted" + (" in time" if r["reclaim_s"] is not None else "") + " after the holder died"),
    ]
    lines.append("")
    lines.append(paper_table(checks))
    lines.append(f"the machine's own wake-up lateness (max over phases): {r['wake_late_ms_max']:.0f} ms")
    lines.append(f"kill -9: {r['kill_waiters_granted']}/8 waiters granted; "
                 f"{r['duration_s']:g}s per phase, {r['threads_per_process']} threads/process; "
                 f"wall time {r['wall_s']:.0f}s on {r['cpus']} CPU(s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_parser(__doc__, "6 s per phase instead of 20")
    ap.add_argument("--clients", default=",".join(map(str, CLIENTS)), help="client counts (default 16,48,96,192)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per phase (default 20, quick 6)")
    ap.add_argument("--threads", type=int, default=4, help="client threads per process (default 4)")
    ap.add_argument("--keep", type=Path, default=None, help="keep ledger files and client records in this folder")
    args = ap.parse_args(argv)
    try:
        clients = sorted({int(c) for c in args.clients.split(",")})
    except ValueError:
        ap.error(f"--clients {args.clients!r}: expected numbers separated by commas")
    if min(clients) < 1 or args.threads < 1 or (args.duration is not None and args.duration <= 0):
        ap.error("--clients, --threads and --duration must be > 0")
    duration = args.duration or (6.0 if args.quick else 20.0)
    print(f"ledger stress: nodes {', '.join(NODES)} of {NODE_GPUS} + {NODE_CPUS} CPUs each; {duration:g}s per phase",
          flush=True)
    result = run(clients, duration, args.threads, args.seed, log=lambda m: print(m, flush=True), keep=args.keep)
    result["quick"] = args.quick
    print(format_table(result, clients))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
