"""What a Salus switch costs on the real executor (thesis §2.3.2, G4: switching at an iteration boundary moves
no state, so it should cost a token hand-off, not a copy).

Two jobs share one lane of a ``SalusExecutor`` under FAIR, so the token changes hands at every boundary. Each
iteration does a little real torch work and logs its span; the *hand-off latency* is the gap between one job's
iteration ending and the other job's next iteration starting (``salus_iterations`` sends ``next``, the
executor's policy decides, the other job's blocked ``ask`` returns). Measured with the jobs as threads of this
process and as separate processes (the runner's default: one worker process per admitted job, a Unix-socket hop).

Releasing the ephemeral blocks at hand-off is ``torch.cuda.empty_cache()`` after a synchronise; it is timed
after an iteration that allocated ``--ephemeral-mb`` on CUDA. Without CUDA it is a no-op (the CPU allocator
caches nothing for the next job to reclaim), and the script says so.

Usage: ``python benchmarks/salus_handoff.py [--quick] [--json OUT] [--iterations N] [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.paper_table import Row, print_beside_paper  # noqa: E402
from gpu.schedulers.salus.controller import SalusJob  # noqa: E402
from tasks.salus.placement import Lane  # noqa: E402
from tasks.salus.executor import SalusExecutor, salus_iterations  # noqa: E402


def _job(lane: Lane, iterations: int, seed: int, spans, ready) -> None:
    """A tiny real trainer step per iteration; appends ``(job, start, end)`` (``time.perf_counter``, which is
    CLOCK_MONOTONIC: comparable across processes on one Linux host). ``ready``: a barrier both jobs pass once
    set up, so neither runs alone while the other is still starting."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model, x = torch.nn.Linear(64, 64), torch.randn(32, 64)
    mine = []  # kept here until the end: appending to a shared list would put an IPC call inside the gap
    ready.wait()
    for _ in salus_iterations(iterations, lane):
        start = time.perf_counter()
        model(x).sum().backward()
        mine.append((lane.job_id, start, time.perf_counter()))
    spans.extend(mine)


def handoff_gaps(spans: list[tuple[str, float, float]]) -> list[float]:
    """Seconds from one job's iteration end to the other job's next iteration start, in one lane."""
    ordered = sorted(spans, key=lambda s: s[1])
    return [b[1] - a[2] for a, b in zip(ordered, ordered[1:]) if a[0] != b[0]]


def _run_both(workers: list) -> None:
    """Start both jobs' workers (threads or processes: the same ``start``/``join``), then wait for both."""
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def measure(iterations: int, seed: int, processes: bool) -> dict[str, float]:
    """Two jobs in FAIR's one lane; the hand-off gaps' median and p95 in ms."""
    with SalusExecutor(None, 0, capacity_mb=16_000, policy="fair", lease=False) as ex:
        lanes = [ex.admit(SalusJob(f"job{i}", 100, 500, on_demand=True)) for i in range(2)]
        if processes:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Manager() as manager:
                spans, ready = manager.list(), ctx.Barrier(2)
                _run_both([ctx.Process(target=_job, args=(lane, iterations, seed + i, spans, ready))
                           for i, lane in enumerate(lanes)])
                spans = list(spans)
        else:
            spans, ready = [], threading.Barrier(2)
            _run_both([threading.Thread(target=_job, args=(lane, iterations, seed + i, spans, ready))
                       for i, lane in enumerate(lanes)])
        for lane in lanes:
            ex.leave(lane.job_id)
    gaps = np.array(handoff_gaps(spans)) * 1e3
    return {"handoffs": len(gaps), "median_ms": float(np.median(gaps)), "p95_ms": float(np.percentile(gaps, 95))}


def empty_cache_cost(ephemeral_mb: int, repeats: int) -> dict[str, float | str]:
    """``torch.cuda.empty_cache()`` after an iteration that allocated and freed ``ephemeral_mb`` (ms)."""
    import torch

    if not torch.cuda.is_available():
        return {"empty_cache": "no-op without CUDA (the CPU allocator keeps no cache for the next job)"}
    times = []
    for _ in range(repeats):
        x = torch.empty(ephemeral_mb * 2 ** 20, dtype=torch.uint8, device="cuda")
        del x
        torch.cuda.synchronize()
        start = time.perf_counter()
        torch.cuda.empty_cache()
        times.append((time.perf_counter() - start) * 1e3)
    return {"empty_cache_median_ms": float(np.median(times)), "empty_cache_p95_ms": float(np.percentile(times, 95)),
            "ephemeral_mb": ephemeral_mb}


def rows(out: dict) -> list[Row]:
    """The hand-off latencies and ``empty_cache``'s cost as rows: the thesis gives no switch time (§2.3.2: a
    switch moves no state, so it should cost a token hand-off, far below one iteration)."""
    none = "the thesis gives no switch time: a switch moves no state (§2.3.2)"
    table = [Row(f"token hand-off, jobs as {kind}: median / p95 ms", f"{out[kind]['median_ms']:.3f} / "
                 f"{out[kind]['p95_ms']:.3f} ({out[kind]['handoffs']} hand-offs)", why=none)
             for kind in ("threads", "processes")]
    if "empty_cache_median_ms" in out:
        table.append(Row(f"empty_cache after {out['ephemeral_mb']} MB: median / p95 ms",
                         f"{out['empty_cache_median_ms']:.3f} / {out['empty_cache_p95_ms']:.3f}", why=none))
    else:
        table.append(Row("empty_cache at hand-off", "no-op", why=out["empty_cache"]))
    return table


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="50 iterations per job instead of --iterations")
    ap.add_argument("--iterations", type=int, default=300, help="iterations per job (default 300)")
    ap.add_argument("--ephemeral-mb", type=int, default=1024, help="ephemeral memory freed before empty_cache")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    n = 50 if args.quick else args.iterations
    out = {"threads": measure(n, args.seed, processes=False), "processes": measure(n, args.seed, processes=True),
           **empty_cache_cost(args.ephemeral_mb, 5 if args.quick else 20)}
    print_beside_paper(rows(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
