"""Measured batch costs of the shipped dynamic DNNs: one padded batch's time per batch size and exit depth.

ORLOJ's simulator prices a batch by how its cost grows with the batch size and with its slowest request's work
(thesis Eq. 4.3/4.4). Rather than choosing that growth, this module times the dynamic torch models the serving
runtime hosts (``tasks.serving.dynamic_models``) on this machine, for b = 1..32 and every exit depth:

* ``exit_by_input`` — ``ExitByInput``: each input says how many of the 12 wide layers it takes, the thesis's
  "model modified to allow us to explicitly control its execution time via input" (§4.5.1);
* ``digits_dynamic`` — ``EarlyExitDigits``, its confidence exit disabled so that a batch runs exactly ``depth``
  refinement steps.

Each cell is the fastest of ``repeats`` timed runs after ``warmup`` dry runs (forward, argmax, predictions
read back: the worker's step), so pre-emption on a shared machine only ever lengthens a run that is not kept.
The result is a JSON file the engine reads without torch (``gpu.sim.orloj.batch_cost``)::

    python -m tasks.serving.batch_costs --out scenarios/orloj/batch_costs/cpu.json
    python -m tasks.serving.batch_costs --device cuda:0 --out scenarios/orloj/batch_costs/gpu.json  # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from gpu.errors import ConfigError
from gpu.sim.orloj.batch_cost import DepthProfile
from tasks.serving.dynamic_models import EarlyExitDigits, ExitByInput, depth_rows

BATCH_SIZES = tuple(range(1, 33))
DEPTHS = tuple(range(1, 13))


def _exit_by_input(depth: int) -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    return ExitByInput(), lambda b: torch.from_numpy(depth_rows(depth, b))


def _digits_dynamic(depth: int) -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    return EarlyExitDigits(max_steps=depth, threshold=2.0), lambda b: torch.rand(b, 64)  # never confident


NETWORKS: dict[str, Callable[[int], tuple[nn.Module, Callable[[int], torch.Tensor]]]] = {
    "exit_by_input": _exit_by_input,
    "digits_dynamic": _digits_dynamic,
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_network(name: str, device: str = "cpu", batch_sizes=BATCH_SIZES, depths=DEPTHS, repeats: int = 7,
                 warmup: int = 2, seed: int = 0) -> list[list[float]]:
    """``ms[i][j]``: the fastest of ``repeats`` runs of a batch of ``batch_sizes[i]`` at depth ``depths[j]``."""
    if name not in NETWORKS:
        raise ConfigError("network", name, f"choose one of {sorted(NETWORKS)}")
    if repeats < 1 or warmup < 0:
        raise ConfigError("repeats", (repeats, warmup), "need repeats >= 1 and warmup >= 0")
    dev = torch.device(device)
    torch.manual_seed(seed)
    base = NETWORKS[name](max(depths))[0]  # one set of weights for every depth
    ms = np.zeros((len(batch_sizes), len(depths)))
    with torch.inference_mode():
        for j, depth in enumerate(depths):
            model, rows = NETWORKS[name](depth)
            model.load_state_dict(base.state_dict())
            model = model.to(dev).eval()
            for i, b in enumerate(batch_sizes):
                x = rows(int(b)).to(dev)
                for _ in range(warmup):
                    model(x).argmax(1).tolist()
                best = np.inf
                for _ in range(repeats):
                    _sync(dev)
                    t0 = time.perf_counter()
                    model(x).argmax(1).tolist()
                    _sync(dev)
                    best = min(best, (time.perf_counter() - t0) * 1000.0)
                ms[i, j] = best
    return ms.round(5).tolist()


def depth_profile(network: str, device: str = "cpu", batch_sizes=(1, 2, 4, 8, 16), depths=(1, 6, 12),
                  repeats: int = 3, attempts: int = 3) -> DepthProfile:
    """A small table measured now and its fit (the serving rollout's, before it serves a dynamic model): about a
    second on a CPU.

    The fixed part of a small model's batch is a fraction of one layer's time, so a loaded machine's noise once
    fitted it at -0.005 ms (the fit refuses a table whose fixed part is not positive). A refused table is measured
    again with twice the repeats (each cell keeps its fastest run), up to ``attempts`` tables; the last refusal
    is raised."""
    def measured(attempt: int) -> DepthProfile:
        ms = np.asarray(time_network(network, device, batch_sizes, depths, repeats * 2 ** attempt, warmup=1))
        return DepthProfile.fit(network, device, tuple(batch_sizes), tuple(depths), ms, where="network")

    for attempt in range(attempts - 1):
        try:
            return measured(attempt)
        except ConfigError:
            continue
    return measured(max(0, attempts - 1))


def measure(device: str = "cpu", networks=tuple(NETWORKS), repeats: int = 7, warmup: int = 2,
            threads: int = 1) -> dict:
    """Every network's table with what it was measured on (the engine's ``batch_cost.load_profile`` format)."""
    torch.set_num_threads(threads)
    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    out = {"device": device, "device_name": name, "torch": torch.__version__, "threads": threads,
           "repeats": repeats, "statistic": "min", "load_average_1m": round(os.getloadavg()[0], 2),
           "command": f"python -m tasks.serving.batch_costs --device {device} --repeats {repeats}",
           "batch_sizes": list(BATCH_SIZES), "depths": list(DEPTHS), "networks": {}}
    for net in networks:
        out["networks"][net] = {"ms": time_network(net, device, repeats=repeats, warmup=warmup)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tasks.serving.batch_costs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="torch device (default: %(default)s; e.g. cuda:0)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per cell; the fastest is kept")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a serving worker uses 1)")
    args = ap.parse_args(argv)
    try:
        result = measure(args.device, repeats=args.repeats, threads=args.threads)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["command"] += f" --out {args.out}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
