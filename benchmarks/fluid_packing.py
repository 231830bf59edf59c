"""G1 + G5 for real: the packing curve of small torch trainers on one device, and a packed 16-trial grid.

G1 (thesis Eq. 3.1, §3.5): p = 1..8 identical MLP trainers on scikit-learn's digits run concurrently on one
device; aggregate throughput per p gives ``O^p``, the fitted ``alpha`` and the packing limit ``c``
(``gpu.schedulers.fluid.fit_packing_curve``). G5: a 16-trial grid (learning rate x hidden width) trained
with ``c`` trials at a time vs one at a time; the makespan ratio is the speed-up (paper target >= 2x on a GPU).

Trainers are separate processes, each with ``torch.set_num_threads(1)``: FLUID packs trials as separate
processes sharing a GPU (MPS/MIG, §3.3.4), processes avoid the GIL, and one thread each makes "p trials on
one device" mean p time-sliced trainers rather than p thread pools fighting over the same cores. On CPU the
curve is the CPU's (it saturates at the core count); on CUDA the GPU is shared by time-slicing (no MPS) and
utilisation is sampled with pynvml. Children start from a ``forkserver`` that preloaded torch.

    python benchmarks/fluid_packing.py [--quick] [--json OUT] [--plots DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np

from gpu.schedulers.fluid import fit_packing_curve


def _trainer(device: str, hidden: int, lr: float, seconds: float, iterations: int, barrier, out) -> None:
    """Train an MLP on digits: for ``seconds`` (curve) or ``iterations`` (grid); report iterations done."""
    import torch
    from sklearn.datasets import load_digits

    torch.set_num_threads(1)
    x, y = load_digits(return_X_y=True)
    xs = torch.tensor(x / 16.0, dtype=torch.float32, device=device)
    ys = torch.tensor(y, device=device)
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step() -> None:
        idx = torch.randint(0, len(ys), (128,), generator=gen).to(device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
        opt.step()

    for _ in range(5):
        step()
    if barrier is not None:
        barrier.wait()
    t0, done = time.perf_counter(), 0
    while (seconds and time.perf_counter() - t0 < seconds) or (iterations and done < iterations):
        step()
        done += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    out.put(done / (time.perf_counter() - t0))


class _GpuMeter:
    """Samples GPU utilisation with pynvml; ``"no GPU"`` when NVML is unavailable."""

    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.name = pynvml.nvmlDeviceGetName(self._handle)
        except Exception as exc:  # pynvml.NVMLError or no library: report, do not fail
            self._nvml, self.name = None, f"no GPU ({type(exc).__name__})"

    def sample(self) -> float | None:
        return None if self._nvml is None else float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)


def packing_level(ctx, device: str, p: int, hidden: int, seconds: float, meter: _GpuMeter) -> tuple[float, float | None]:
    """Aggregate iterations/s of p concurrent trainers, and mean GPU utilisation while they ran."""
    barrier, out = ctx.Barrier(p + 1), ctx.Queue()
    procs = [ctx.Process(target=_trainer, args=(device, hidden, 0.05, seconds, 0, barrier, out)) for _ in range(p)]
    for proc in procs:
        proc.start()
    barrier.wait()
    util, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        u = meter.sample()
        if u is not None:
            util.append(u)
        time.sleep(0.1)
    rates = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    return float(sum(rates)), (float(np.mean(util)) if util else None)


def grid_makespan(ctx, device: str, concurrent: int, hidden: int, iterations: int) -> float:
    """Train the 16-trial grid with ``concurrent`` trainers at a time; wall-clock seconds."""
    configs = [(h, lr) for h in (hidden // 2, hidden, hidden * 3 // 2, hidden * 2) for lr in (0.01, 0.03, 0.1, 0.3)]
    out, t0 = ctx.Queue(), time.perf_counter()
    pending, running = list(configs), []
    while pending or running:
        while pending and len(running) < concurrent:
            h, lr = pending.pop(0)
            running.append(ctx.Process(target=_trainer, args=(device, h, lr, 0.0, iterations, None, out)))
            running[-1].start()
        running[0].join()
        running = [r for r in running if r.is_alive()]
    for _ in configs:
        out.get()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter levels and grid (< 3 min on 2 cores)")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--plots", metavar="DIR", default=".state/benchmarks/fluid")
    ap.add_argument("--hidden", type=int, default=64)
    args = ap.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # forkserver: children fork from a clean single-threaded server that imported torch once (fast starts,
    # no fork-after-BLAS/OpenMP-threads hangs, no CUDA context inherited from this process).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "sklearn.datasets"])
    meter = _GpuMeter()
    seconds = 1.0 if args.quick else 6.0
    ps = list(range(1, 9))
    t0 = time.time()
    print(f"device: {device} ({torch.cuda.get_device_name(0) if device == 'cuda' else 'CPU'}); NVML: {meter.name}")
    levels = [packing_level(ctx, device, p, args.hidden, seconds, meter) for p in ps]
    curve = fit_packing_curve(ps, [x for x, _ in levels])
    print(f"\nG1 packing curve (MLP {args.hidden} hidden, batch 128, {seconds:.0f} s per level)")
    print(f"{'p':>3} {'iters/s total':>14} {'s/iter/trial':>13} {'O^p':>7} {'GPU util %':>11}")
    for i, (p, (x, u)) in enumerate(zip(ps, levels)):
        o = f"{curve.marginal_benefit[i - 1]:7.3f}" if i else "      -"
        print(f"{p:>3} {x:>14.1f} {p / x:>13.5f} {o} {('%.0f' % u) if u is not None else 'n/a':>11}")
    print(f"fitted alpha = {curve.alpha:.3f}, t1 = {curve.t1 * 1e3:.2f} ms, c = {curve.c} (O_th = {curve.o_th})"
          f"   paper: O^p decreasing; one small trial uses 'at most 60%' of a GPU")

    iterations = 100 if args.quick else 1500
    packed = grid_makespan(ctx, device, max(curve.c, 1), args.hidden, iterations)
    alone = grid_makespan(ctx, device, 1, args.hidden, iterations)
    print(f"\nG5 16-trial grid, {iterations} iterations each: one at a time {alone:.1f} s, "
          f"{curve.c} packed {packed:.1f} s -> speed-up {alone / packed:.2f}x   (target >= 2x on a GPU)")
    figures = {"packing_alpha": curve.alpha, "packing_c": curve.c, "packing_t1_s": curve.t1,
               "grid16_sequential_s": alone, "grid16_packed_s": packed, "grid16_speedup": alone / packed,
               "on_gpu": float(device == "cuda"), "runtime_s": time.time() - t0}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(args.plots).mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ps, [x for x, _ in levels], "o-", label="measured")
    ax.plot(ps, [p / (curve.t1 * curve.alpha ** (p - 1)) for p in ps], "--", label=f"fit alpha={curve.alpha:.2f}")
    ax.set(xlabel="trials packed on one device", ylabel="aggregate iterations/s", title=f"G1 packing curve ({device})")
    ax.legend()
    fig.tight_layout()
    path = Path(args.plots) / "fluid_packing_curve.png"
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
        print(f"wrote {args.json}")
    print(f"runtime {figures['runtime_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
