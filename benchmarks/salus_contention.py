"""How much two Salus lanes slow each other on this machine: one stand-in job alone vs two in lockstep (§2.4.1).

PACK runs one iteration per lane at once, and Salus does not schedule compute across lanes (thesis §5.1), so how
much PACK gains depends on how much two concurrent iterations slow each other — which the thesis does not give.
The simulator models it as processor sharing: lanes progress at ``min(1, 1/sum u)`` of solo speed, ``u`` in
(0, 1] a job's compute intensity. This measures it instead. Two worker processes (as the runner's process mode
runs Salus jobs) build the same stand-in trainer (``tasks.salus.standin``: a Table A.1 workload's memory at
``MEMORY_SCALE``), then take turns in rounds: process 0 runs ``--iterations`` alone, then both run that many in
lockstep (each iteration starts at a barrier, so the two are in flight together). Per round the slowdown is the
median lockstep iteration over the median solo one (rounds interleave, so a machine whose load drifts is compared
with itself); the figure is the median over rounds. Two identical lanes each at ``min(1, 1/(2u))`` of solo speed
are slowed ``max(1, 2u)``, so ``u = min(1, slowdown / 2)`` is the simulator's measured input
(``benchmarks/salus.py`` reads it).

On a CPU the two processes get a core each where cores are free; on a GPU (``--device cuda:0``) kernels of the two
processes time-slice the device. The figure is this machine's, not a P100's.

    python benchmarks/salus_contention.py [--quick] [--json OUT] [--workload resnet50_50] [--device cpu]
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.cli import benchmark_parser, finish
from benchmarks.paper_table import Row, print_beside_paper
from gpu.sim.salus.workloads import all_workloads, workload
from tasks.salus.standin import StandIn, stand_in

WORKLOAD = "resnet50_50"  # the thesis's compute-bound S4 job (§2.5.2)


def _worker(rank: int, shape: StandIn, device: str, rounds: int, iterations: int, barrier: Any, out: Any) -> None:
    """Build the stand-in, then per round: rank 0 alone for ``iterations``, then both in lockstep; send the times."""
    import torch

    from tasks.digits import digits_tensors, mlp
    from tasks.salus.standin import train_step

    torch.set_num_threads(1)
    dev = torch.device(device)
    xs, ys = digits_tensors(dev)
    model = mlp(shape.hidden, rank, dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)

    def step() -> float:
        start = time.perf_counter()
        train_step(model, opt, xs, ys, shape.batch, gen)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - start

    for _ in range(2):  # warm-up: Adam's state, first-use paths
        step()
    for _ in range(rounds):
        alone = [step() for _ in range(iterations)] if rank == 0 else []
        together = []
        for _ in range(iterations):
            barrier.wait()
            together.append(step())
        barrier.wait()
        out.put((rank, alone, together))


def measure_contention(workload_name: str = WORKLOAD, device: str = "cpu", rounds: int = 5, iterations: int = 20
                       ) -> dict[str, float]:
    """Run the lockstep measurement (module docstring); the solo and lockstep median iteration seconds, the
    slowdown and the simulator's ``u``, with the machine's CPU count and load average at the start."""
    w = workload(workload_name)
    shape = stand_in("train", w.persistent_mb, w.ephemeral_mb)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    load = os.getloadavg()[0]
    workers = [ctx.Process(target=_worker, args=(r, shape, device, rounds, iterations, barrier, out), daemon=True)
               for r in range(2)]
    for p in workers:
        p.start()
    per_round: dict[int, list] = {0: [], 1: []}
    for _ in range(2 * rounds):
        rank, alone, together = out.get(timeout=600)
        per_round[rank].append((alone, together))
    for p in workers:
        p.join(60)
    ratios, solo, pair = [], [], []
    for (alone, together0), (_, together1) in zip(per_round[0], per_round[1]):
        s, t = statistics.median(alone), statistics.median(together0 + together1)
        solo.append(s)
        pair.append(t)
        ratios.append(t / s)
    slowdown = statistics.median(ratios)
    return {"contention_solo_ms": 1e3 * statistics.median(solo), "contention_pair_ms": 1e3 * statistics.median(pair),
            "contention_slowdown": slowdown, "contention_u": min(1.0, max(1e-3, slowdown / 2)),
            "contention_cpus": float(os.cpu_count() or 0), "contention_load_average": load}


def rows(figures: dict[str, float]) -> list[Row]:
    """The measurement as rows: the thesis gives no figure for it (Salus does not schedule compute, §5.1)."""
    none = "the thesis gives none: Salus does not schedule compute across lanes (§5.1)"
    return [Row("iteration alone (ms)", f"{figures['contention_solo_ms']:.2f}", why=none),
            Row("iteration, two in lockstep (ms)", f"{figures['contention_pair_ms']:.2f}", why=none),
            Row("slowdown of two lanes", f"{figures['contention_slowdown']:.2f}x", why=none),
            Row("simulator u = min(1, slowdown / 2)", f"{figures['contention_u']:.2f}", why=none)]


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_parser(__doc__, "3 rounds of 10 iterations instead of 5 of 20", seed=None)
    ap.add_argument("--workload", default=WORKLOAD, choices=all_workloads(), metavar="NAME",
                    help=f"the Table A.1 workload whose stand-in runs (default {WORKLOAD})")
    ap.add_argument("--device", default="cpu", help="torch device the two processes run on (default cpu)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    figures = measure_contention(args.workload, args.device, *((3, 10) if args.quick else (5, 20)))
    print(f"two {args.workload} stand-ins on {args.device} ({figures['contention_cpus']:.0f} CPUs, load average "
          f"{figures['contention_load_average']:.1f})")
    print_beside_paper(rows(figures))
    return finish(args, figures, started)


if __name__ == "__main__":
    sys.exit(main())
