"""Dispatch overhead of the serving runtime vs the served models' batch-1 latency (target ≤ 5 %).

Overhead per request = wall time the runtime spends on a request outside the model's forward pass:
the frontend's ``submit`` (stamp, route, enqueue) plus the worker's busy time minus its forward passes
(batch-policy decision over the session's ring, the batch's slice, result hand-back, loop and wake-ups),
over the requests. Measured side by side in one run, per model:

* ``batch1`` — the model's batch-1 forward latency (the worker's step: forward, argmax, read-back),
  median of timed calls in this process;
* ``batch1 path`` — frontend + worker driven one request at a time in one thread (``run_once``): every
  request is a batch of one, nothing amortises the per-batch work — the worst case and the floor of a
  Python runtime;
* ``in situ`` — the real runtime (worker thread, lease, Poisson load from the load generator's thread,
  requests stamped with their scheduled arrival times): run to completion (an idle worker's batch runs on
  the submitting thread; the default) and, beside it, every batch on the worker's thread (``thread``); at
  the high rate also with a load-generator tick (``--tick-ms``: bursts of rate × tick per frontend call);
* ``python floor`` — a skeleton of the batch-1 path on C builtins only: back to back, and with each request
  after the idle gap of the in-situ rate, its batch-1 forward timed the same way (both start cold there).

On a machine with an NVIDIA GPU (``--devices auto``, the default: the pool is what NVML finds) every model,
forward and worker runs on ``cuda:0`` and the in-situ rows add the GPU's utilisation, sampled through NVML
while the load runs; ``--devices simulated`` keeps everything on the CPU.

    python benchmarks/serving_runtime.py --quick --json out.json
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.cli import benchmark_parser, write_json  # noqa: E402
from benchmarks.paper_table import Row, judged, print_beside_paper  # noqa: E402
from gpu.report import format_table  # noqa: E402
from gpu.schedulers.nexus.batching import EarlyDropPolicy  # noqa: E402
from gpu.devices import PoolSpec, discover, nvml_utilization  # noqa: E402
from gpu.ledger import PoolLedger  # noqa: E402
from gpu.schedulers.nexus.squishy import Session, SquishyPacker  # noqa: E402
from tasks.serving.frontend import Frontend  # noqa: E402
from tasks.serving.loadgen import LoadGenerator, RateTrace  # noqa: E402
from tasks.serving.models import load_digits_tensors, load_or_train, profile_model  # noqa: E402
from tasks.serving.runtime import LocalServingRuntime  # noqa: E402
from tasks.serving.stats import Recorder  # noqa: E402
from tasks.serving.worker import ServingWorker  # noqa: E402

TARGET = 0.05
MODELS = ("digits_mlp", "digits_cnn_small", "digits_cnn")


def batch1_latency_us(model: torch.nn.Module, n: int, device: str) -> float:
    """Median wall time of the worker's forward step on one input (``.tolist()`` waits for the GPU)."""
    model = model.to(device)
    x = torch.rand(1, 64, device=device)
    samples = []
    with torch.inference_mode():
        for _ in range(50):
            model(x).argmax(1).tolist()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            model(x).argmax(1).tolist()
            samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return samples[len(samples) // 2] / 1e3


def _floor_skeleton():
    """``(submit, run_once)``: a skeleton of the batch-1 path with every data structure a C builtin.

    The frontend's call (route lookup, stamp arithmetic, a deque push standing in for a native ring), the
    worker's pop, the deadline check against ℓ(1) and one record append; no numpy, no lock, no counters, no
    model. What it costs is the floor under any runtime whose request path passes through the interpreter.
    """
    queue: deque = deque()
    log: list = []
    now = time.perf_counter_ns
    routes = {"s": (20_000_000, queue.append)}

    def submit(sid: str, row: np.ndarray, arrival: int, rid: int) -> int:
        slo, push = routes[sid]
        push((rid, arrival, arrival + slo, row))
        return rid

    def run_once() -> bool:
        if not queue:
            return False
        rid, arrival, deadline, row = queue.popleft()
        log.append((rid, arrival, deadline, now() if deadline >= now() + 35_000 else None))
        return True

    return submit, run_once


def python_floor_us(n: int = 200_000) -> float:
    """µs per request of the floor skeleton run back to back (hot caches: the batch-1 path's setting)."""
    submit, run_once = _floor_skeleton()
    x = np.zeros((1, 64), np.float32)
    now = time.perf_counter_ns
    t0 = now()
    for i in range(n):
        submit("s", x, now(), i)
        run_once()
    return (now() - t0) / n / 1e3


def python_floor_after_idle_us(model: torch.nn.Module, row: torch.Tensor, gap_s: float,
                               n: int = 2000) -> tuple[float, float]:
    """(floor µs, batch-1 forward µs), medians, when each request follows ``gap_s`` of idle — the in-situ
    setting at a low rate, where the skeleton and the forward both start with cold caches."""
    submit, run_once = _floor_skeleton()
    now = time.perf_counter_ns
    floor, fwd = [], []
    with torch.inference_mode():
        for i in range(n):
            time.sleep(gap_s)
            t0 = now()
            submit("s", row, t0, i)
            run_once()
            t1 = now()
            model(row).argmax(1).tolist()
            t2 = now()
            floor.append(t1 - t0)
            fwd.append(t2 - t1)
    return float(np.median(floor)) / 1e3, float(np.median(fwd)) / 1e3


def batch1_path(models, profiles, plan, rows, n: int, block: int, device: str) -> dict[str, float]:
    """Frontend + worker, one request at a time in this thread: µs per request, medians over blocks.

    Overhead and forward time are measured per block of ``block`` requests (~1 ms, shorter than a
    scheduler time slice) and the median block is reported, so the blocks in which another process
    pre-empted us on a shared machine do not set the figure.
    """
    rec = Recorder()
    worker = ServingWorker(plan.nodes[0], models, profiles, EarlyDropPolicy(), rec, device)  # not started: driven here
    front = Frontend(rec)
    front.set_plan(plan, {0: worker})
    sid = plan.sessions[0].session_id
    saved = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(100_000, *saved[1:])  # what LocalServingRuntime does while open
    blocks: list[tuple[float, float, float]] = []
    try:
        with torch.inference_mode():
            for i in range(200):  # warm-up
                front.submit(sid, rows[i % len(rows)])
                worker.run_once()
            for start in range(0, n, block):
                fe0, ex0 = front.route_ns, worker.execute_ns
                t0 = time.perf_counter_ns()
                for i in range(start, start + block):
                    front.submit(sid, rows[i % len(rows)])
                    worker.run_once()
                wall = time.perf_counter_ns() - t0
                fwd = worker.execute_ns - ex0
                blocks.append(((wall - fwd) / block, (front.route_ns - fe0) / block, fwd / block))
    finally:
        gc.set_threshold(*saved)
        gc.unfreeze()
    assert worker.batches == worker.served  # every request was a batch of one
    med = [sorted(col)[len(col) // 2] / 1e3 for col in zip(*blocks)]
    return {"overhead_us": med[0], "frontend_us": med[1], "forward_us": med[2]}


class UtilisationSampler:
    """Mean NVML utilisation (percent) of the pool's GPUs while the block runs; NaN on a simulated pool."""

    def __init__(self, pool: PoolSpec, period_s: float = 0.1):
        self.enabled, self.period_s = not pool.simulated, period_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.period_s):
            util = nvml_utilization()
            if util:
                self.samples.append(max(util.values()))

    def __enter__(self) -> "UtilisationSampler":
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


def in_situ(models, profiles, plan, data, rate: float, duration: float, seed: int, pool: PoolSpec,
            run_inline: bool = True, tick_s: float = 0.0) -> dict[str, float]:
    """The runtime serving ``name`` under Poisson load on the pool's first device: overhead per request, the
    service figures and (on a GPU) its utilisation."""
    sid = plan.sessions[0].session_id
    with LocalServingRuntime(models, profiles, PoolLedger(pool), run_inline=run_inline) as rt:
        rt.apply(plan)
        with UtilisationSampler(pool) as util:
            load = LoadGenerator(rt.frontend.submit, RateTrace.constant({sid: rate}, duration), data.x_test,
                                 data.y_test, seed, rt.frontend.submit_many, tick_s).run()
    w = rt.recorder.window(labels=load.labels)
    return {**rt.overhead(), "offered_rps": w.offered_rps, "throughput_rps": w.throughput_rps,
            "slo_attainment": w.slo_attainment, "p50_latency_ms": w.p50_latency_ms,
            "p99_latency_ms": w.p99_latency_ms, "requests_per_call": load.sent / max(1, load.calls),
            "gpu_utilisation_pct": util.mean}


def beside_target(out: dict, rate: float, high_rate: float, tick_ms: float) -> list[Row]:
    """The overhead fractions beside the target (ours, no paper figure): the smallest model's in-situ run is the
    one the target is about; the others show where it moves (rate, tick, a larger model, the floors)."""
    mlp = out["smallest_model"]
    frac = out["dispatch_overhead_frac_of_batch1"]
    return [judged(f"{mlp} in situ {rate:.0f} req/s: overhead / batch-1", f"{frac:.1%}",
                   f"target <= {TARGET:.0%}", frac <= TARGET,
                   f"batches of {out[f'{mlp}_in_situ_mean_batch']:.1f}: the per-batch work amortises less than at "
                   f"{high_rate:.0f} req/s ({out['dispatch_overhead_frac_of_batch1_high_rate']:.1%})"),
            Row(f"... at {high_rate:.0f} req/s", f"{out['dispatch_overhead_frac_of_batch1_high_rate']:.1%}"),
            Row(f"... at {high_rate:.0f} req/s, {tick_ms:g} ms tick",
                f"{out['dispatch_overhead_frac_of_batch1_high_rate_tick']:.1%}"),
            Row(f"digits_cnn in situ {rate:.0f} req/s", f"{out['digits_cnn_in_situ_frac_of_batch1']:.1%}"),
            Row(f"{mlp} batch-1 path (1 thread)", f"{out['batch1_path_overhead_frac_of_batch1']:.1%}"),
            Row("python floor, back to back", f"{out['python_floor_frac_of_batch1']:.1%}"),
            Row(f"python floor after {1e3 / rate:g} ms idle", f"{out['python_floor_after_idle_frac_of_batch1']:.1%}")]


def _floor(run: str, overhead_us: float, forward_us: float) -> dict:
    """The first columns of an overhead table's row (µs; ratio = overhead / forward in %)."""
    return {"run": run, "overhead": round(overhead_us, 2), "forward": round(forward_us, 1),
            "ratio %": round(100 * overhead_us / forward_us, 1)}


def _line(run: str, overhead_us: float, forward_us: float, frontend_us: float, batch: float, per_call: float) -> dict:
    """One row of a model's overhead table: the floor's columns, then the frontend's µs, the mean batch and the
    requests per frontend call."""
    return {**_floor(run, overhead_us, forward_us), "frontend": round(frontend_us, 2), "batch": round(batch, 1),
            "req/call": round(per_call, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_parser(__doc__, "3 s of load per run instead of 15 s")
    ap.add_argument("--rate", type=float, default=2000.0, help="offered requests/s in situ (batches of ~1-2)")
    ap.add_argument("--high-rate", type=float, default=50000.0,
                    help="a second in-situ rate for the smallest model, where batches form and amortise")
    ap.add_argument("--tick-ms", type=float, default=0.5,
                    help="load-generator tick of the extra high-rate run (bursts of rate x tick per frontend call)")
    ap.add_argument("--devices", choices=("auto", "simulated"), default="auto",
                    help="auto: the GPUs NVML finds, else the CPU; simulated: the CPU even on a GPU machine")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    data = load_digits_tensors(args.seed)
    x = data.x_test.numpy()
    rows = [x[k:k + 1] for k in range(len(x))]  # 1×64 float32 requests, as the load generator sends them
    duration, n_path = (3.0, 5000) if args.quick else (15.0, 20000)
    pool = discover("2x16GiB", args.devices)
    device = "cpu" if pool.simulated or not torch.cuda.is_available() else "cuda:0"
    out: dict[str, float | str] = {"load_average_1min": os.getloadavg()[0], "rate_rps": args.rate, "device": device,
                                   "high_rate_rps": args.high_rate, "tick_ms": args.tick_ms, "target_fraction": TARGET}
    print(f"device: {device}" + ("" if pool.simulated else f" ({pool.nodes[0].devices[0].name})")
          + f", load average {out['load_average_1min']:.2f}")
    print("dispatch overhead per request / the model's batch-1 forward, both measured in the same loop (µs)")
    print("vs sa: the overhead over the standalone batch-1 median")
    for name in MODELS:
        table = []
        model = load_or_train(name, 150, args.seed)
        models, profiles = {name: model}, {name: profile_model(name, model, device, repeats=20)}
        b1 = batch1_latency_us(model, 2000, device)
        out[f"{name}_batch1_us"] = b1
        plan = SquishyPacker(profiles).plan([Session(name, name, 20.0, args.rate)])
        p = batch1_path(models, profiles, plan, rows, n_path, max(4, int(1000 / b1)), device)
        frac = p["overhead_us"] / p["forward_us"]
        out.update({f"{name}_batch1_path_overhead_us": p["overhead_us"], f"{name}_batch1_path_forward_us": p["forward_us"],
                    f"{name}_batch1_path_frac_of_batch1": frac, f"{name}_batch1_path_frontend_us": p["frontend_us"]})
        table.append(_line("batch-1 path (1 thread)", p["overhead_us"], p["forward_us"], p["frontend_us"], 1, 1))
        runs = []  # (key, label, rate, run inline, tick s)
        if name != "digits_cnn_small":
            runs += [("in_situ", f"in situ {args.rate:.0f} req/s", args.rate, True, 0.0),
                     ("in_situ_thread", f"in situ {args.rate:.0f}, thread", args.rate, False, 0.0)]
        if name == MODELS[0]:
            runs += [("in_situ_high", f"in situ {args.high_rate:.0f} req/s", args.high_rate, True, 0.0),
                     ("in_situ_high_thread", f"in situ {args.high_rate:.0f}, thread", args.high_rate, False, 0.0),
                     ("in_situ_high_tick", f"in situ {args.high_rate:.0f}, {args.tick_ms:g} ms tick",
                      args.high_rate, True, args.tick_ms / 1e3)]
        for key, label, rate, inline, tick in runs:
            plan = SquishyPacker(profiles).plan([Session(name, name, 20.0, rate)])
            r = in_situ(models, profiles, plan, data, rate, duration, args.seed, pool, inline, tick)
            # the batch-1 forwards of this run, if there are enough of them to stand for it (at a high rate the
            # few batches of one follow idle gaps: cold caches, not typical), else the standalone median
            fwd = r["batch1_execute_us"] if r["batches_of_one"] >= 100 else b1
            frac = r["dispatch_overhead_us"] / fwd
            out.update({f"{name}_{key}_overhead_us": r["dispatch_overhead_us"], f"{name}_{key}_batch1_forward_us": fwd,
                        f"{name}_{key}_frac_of_batch1": frac,
                        f"{name}_{key}_frac_of_standalone_batch1": r["dispatch_overhead_us"] / b1,
                        f"{name}_{key}_frontend_us": r["frontend_us_per_request"],
                        f"{name}_{key}_worker_us": r["worker_us_per_request"],
                        f"{name}_{key}_mean_batch": r["mean_batch"], f"{name}_{key}_slo_attainment": r["slo_attainment"],
                        f"{name}_{key}_p50_latency_ms": r["p50_latency_ms"], f"{name}_{key}_inline_share": r["inline_share"],
                        f"{name}_{key}_requests_per_call": r["requests_per_call"],
                        f"{name}_{key}_throughput_rps": r["throughput_rps"],
                        f"{name}_{key}_p99_latency_ms": r["p99_latency_ms"]})
            if not pool.simulated:
                out[f"{name}_{key}_gpu_utilisation_pct"] = r["gpu_utilisation_pct"]
            table.append({**_line(label, r["dispatch_overhead_us"], fwd, r["frontend_us_per_request"],
                                  r["mean_batch"], r["requests_per_call"]),
                          "inline": round(r["inline_share"], 2), "SLO": round(r["slo_attainment"], 3),
                          "vs sa %": round(100 * r["dispatch_overhead_us"] / b1, 1),
                          **({} if pool.simulated else {"req/s": round(r["throughput_rps"]),
                                                        "p99 ms": round(r["p99_latency_ms"], 2),
                                                        "GPU %": round(r["gpu_utilisation_pct"])})})
        table.append({"run": "standalone batch-1 median", "forward": round(b1, 1)})
        print(f"\n{name}")
        print(format_table(table))
    floor = python_floor_us()
    out["python_floor_us"] = floor
    out["python_floor_frac_of_batch1"] = floor / out[f"{MODELS[0]}_batch1_us"]
    b1 = out[f"{MODELS[0]}_batch1_us"]
    floors = [{**_floor("skeleton, C builtins only", floor, b1),
               "what": "the least any request path through the interpreter costs"}]
    gap = 1.0 / args.rate
    cold, cold_fwd = python_floor_after_idle_us(load_or_train(MODELS[0], 150, args.seed).to(device),
                                                torch.from_numpy(rows[0]).to(device), gap, 500 if args.quick else 2000)
    out.update({"python_floor_after_idle_us": cold, "python_floor_after_idle_forward_us": cold_fwd,
                "python_floor_after_idle_frac_of_batch1": cold / cold_fwd})
    floors.append({**_floor(f"after {1e3 * gap:g} ms idle, + forward", cold, cold_fwd),
                   "what": f"the same, each request after the idle gap of {args.rate:.0f} req/s"})
    print("\npython floor")
    print(format_table(floors))
    mlp = MODELS[0]
    out["smallest_model"] = mlp
    out["smallest_batch1_us"] = out[f"{mlp}_batch1_us"]
    out["dispatch_overhead_us"] = out[f"{mlp}_in_situ_overhead_us"]
    out["dispatch_overhead_frac_of_batch1"] = out[f"{mlp}_in_situ_frac_of_batch1"]
    out["dispatch_overhead_frac_of_batch1_high_rate"] = out[f"{mlp}_in_situ_high_frac_of_batch1"]
    out["dispatch_overhead_frac_of_batch1_high_rate_tick"] = out[f"{mlp}_in_situ_high_tick_frac_of_batch1"]
    out["batch1_path_overhead_frac_of_batch1"] = out[f"{mlp}_batch1_path_frac_of_batch1"]
    out["meets_target"] = float(out["dispatch_overhead_frac_of_batch1"] <= TARGET)
    print()
    print_beside_paper(beside_target(out, args.rate, args.high_rate, args.tick_ms))
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
