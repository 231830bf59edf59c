"""The trial_groups flow's model and data, and the packing curve (thesis Eq. 3.1, G1) measured on them.

``Trainers`` keeps ``workers`` persistent trainer processes on one device (forked from a ``forkserver`` that
preloaded torch and this module, one torch thread each): ``level(p, ...)`` starts p of them together on the
same number of iterations, so "p trials packed on one device" means p time-sliced trainers, the way FLUID packs
trials as separate processes (§3.3.4). ``measure_packing_curve`` runs p = 1..k and fits ``alpha`` and ``c``
with ``gpu.schedulers.fluid.algorithms.fit_packing_curve``. Used by ``benchmarks/fluid_packing.py`` (long measurement,
saved per device in the state folder) and by the flow's start-up when no curve was saved (a short one).

Prefect-free on purpose: trainer processes fork with torch and this module loaded, and nothing else.
Work is bounded by iterations, never by wall time. On CPU the "device" is the machine's cores.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import queue
import time
from typing import Callable, Sequence

import numpy as np

from gpu.schedulers.fluid.algorithms import PackingCurve, fit_packing_curve


@functools.lru_cache(maxsize=4)
def digits_split(seed: int = 0):
    """Standardised ``load_digits`` features, split 80/20 into train/validation tensors (seeded)."""
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order].astype("float32") / 16.0, y[order]
    cut = int(0.8 * len(x))
    mean, std = x[:cut].mean(0), x[:cut].std(0) + 1e-6
    x = (x - mean) / std
    t = torch.from_numpy
    return t(x[:cut]), t(y[:cut]).long(), t(x[cut:]), t(y[cut:]).long()


def build_mlp(hidden: int):
    """64 pixels -> ``hidden`` -> 10 digits."""
    import torch.nn as nn

    return nn.Sequential(nn.Linear(64, int(hidden)), nn.ReLU(), nn.Linear(int(hidden), 10))


def _worker(device: str, batch: int, data: tuple[np.ndarray, np.ndarray], barriers: dict, jobs, results) -> None:
    """A trainer process: runs ``(kind, key, p, hidden, lr, iterations)`` jobs until it receives None.

    ``kind == "level"`` waits on ``barriers[p]`` with the p - 1 other trainers of the level and the parent,
    so all p start together; ``"trial"`` trains one config. Replies ``(key, start, end)`` in
    ``time.monotonic()`` seconds (one system-wide clock), the device synchronised at both ends.
    """
    import torch

    torch.set_num_threads(1)
    xs, ys = (torch.from_numpy(a).to(device) for a in data)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def trainer(hidden: int, lr: float, seed: int):
        """The flow's MLP + its optimizer; returns its one-iteration step (a seeded random batch)."""
        gen = torch.Generator().manual_seed(seed)
        model = build_mlp(hidden).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

        def step() -> None:
            idx = torch.randint(0, len(ys), (batch,), generator=gen).to(device)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
            opt.step()

        return step

    warm = trainer(64, 0.05, 0)  # first use of autograd/optim/kernels costs seconds on a busy machine: not timed
    for _ in range(5):
        warm()
    sync()
    results.put(("ready", 0.0, 0.0))
    while (job := jobs.get()) is not None:
        kind, key, p, hidden, lr, iterations = job
        step = trainer(hidden, lr, key)
        if kind == "level":
            for _ in range(5):  # warm-up (allocator, kernels) outside the timed region
                step()
            sync()
            barriers[p].wait()
        start = time.monotonic()
        for _ in range(iterations):
            step()
        sync()
        results.put((key, start, time.monotonic()))


class Trainers:
    """``workers`` persistent trainer processes on one device, a job queue each and one result queue.

    ``sample`` (e.g. an NVML utilisation reading) is called every 0.1 s while waiting for results.
    """

    def __init__(self, device: str, workers: int = 8, batch: int = 64,
                 sample: Callable[[], float | None] = lambda: None):
        # forkserver: children fork from a clean single-threaded server that imported torch once (fast starts,
        # no fork-after-OpenMP-threads hangs, no CUDA context inherited from this process). torch._dynamo is
        # what a first optimizer imports (~800 modules, seconds per child on a busy machine): preloaded too.
        # The training split comes from this process, so the server imports neither sklearn nor scipy.
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch._dynamo", __name__])
        xt, yt, _, _ = digits_split(0)
        data = (xt.numpy(), yt.numpy())
        self.sample = sample
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(workers)]
        self.barriers = {p: ctx.Barrier(p + 1) for p in range(1, workers + 1)}
        self.procs = [ctx.Process(target=_worker, args=(device, batch, data, self.barriers, q, self.results),
                                  daemon=True) for q in self.jobs]
        t0 = time.monotonic()
        for proc in self.procs:
            proc.start()
        try:
            for _ in self.procs:  # every trainer has torch, the data and (on CUDA) its context before any timing
                self._collect([])
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - t0

    def __enter__(self) -> Trainers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _collect(self, util: list[float]) -> tuple:
        """Next result; samples utilisation every 0.1 s while waiting (a dead worker is an error)."""
        while True:
            try:
                return self.results.get(timeout=0.1)
            except queue.Empty:
                if not all(proc.is_alive() for proc in self.procs):
                    raise RuntimeError("a trainer process died")
                if (u := self.sample()) is not None:
                    util.append(u)

    def level(self, p: int, hidden: int, iterations: int) -> tuple[float, float, float | None]:
        """p trainers x ``iterations`` started together: (aggregate iterations/s, mean s/iteration/trial, util %)."""
        for rank in range(p):
            self.jobs[rank].put(("level", rank, p, hidden, 0.05, iterations))
        self.barriers[p].wait()
        util: list[float] = []
        spans = [self._collect(util) for _ in range(p)]
        wall = max(end for _, _, end in spans) - min(start for _, start, _ in spans)
        per_trial = float(np.mean([end - start for _, start, end in spans])) / iterations
        return p * iterations / wall, per_trial, (float(np.mean(util)) if util else None)

    def run(self, configs: Sequence[tuple[int, float]], concurrent: int, iterations: int) -> tuple[float, float | None]:
        """Train ``(hidden, lr)`` configs ``concurrent`` at a time, the next on the first idle trainer: (s, util %)."""
        pending = list(enumerate(configs))
        util: list[float] = []
        idle, busy = list(range(concurrent)), {}
        t0 = time.monotonic()
        while pending or busy:
            while pending and idle:
                rank, (key, (hidden, lr)) = idle.pop(0), pending.pop(0)
                busy[key] = rank
                self.jobs[rank].put(("trial", key, 1, hidden, lr, iterations))
            key, _, _ = self._collect(util)
            idle.append(busy.pop(key))
        return time.monotonic() - t0, (float(np.mean(util)) if util else None)

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()


def measure_packing_curve(device: str = "cpu", max_p: int = 4, iterations: int = 300, hidden: int = 64,
                          batch: int = 64) -> PackingCurve:
    """A short G1 measurement: p = 1..max_p trainers of the flow's MLP on ``device``, fitted (Eq. 3.1).

    ``c`` is capped at ``max_p`` (the largest level measured). A few seconds on CPU, mostly process start-up.
    """
    with Trainers(device, workers=max_p, batch=batch) as trainers:
        levels = range(1, max_p + 1)
        throughputs = [trainers.level(p, hidden, iterations)[0] for p in levels]
    return fit_packing_curve(list(levels), throughputs)
