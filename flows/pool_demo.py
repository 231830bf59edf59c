"""Demo of the GPU task runner: ~20 tasks with mixed requests placed on a (simulated) 2-GPU pool.

Each task does real torch work (a few steps of a tiny MLP on scikit-learn's digits) on the
slice it was given, and the flow prints which task held which slice when.

    python -m flows.pool_demo --tasks 20 --mode process
"""

from __future__ import annotations

import sys
import time

from prefect import flow, task
from prefect.futures import as_completed

from gpu.errors import ConfigError, GpuflowsError
from gpu.pool import pool_path
from gpu.scenario import MAX_COUNT, integer
from gpuflows.args import error, flow_parser, simulated
from resource_blocks import GpuPool, MlflowTarget
from tasks.digits import digits_tensors, mlp
from tasks.runtime.flow import RunIdentity, log_flow_inputs, publish_mlflow_link, run_namer, settings
from tasks.runtime.requests import current_placement, gpu_options
from tasks.report.occupancy import publish_pool_occupancy
from tasks.runtime.runners import GpuTaskRunner
from tasks.runtime.slices import enforce
from tasks.runtime.tracking import ExperimentView
from tasks.report.progress import FlowProgress

# (gpus, memory) cycled over the submitted tasks: fractions, whole GPUs and memory caps.
MIX: list[tuple[float, str | int]] = [(0.25, 0), (0.5, "4GiB"), (1, 0), (0.25, "2GiB"), (2, 0), (0.5, 0), (0, "6GiB")]


@task
def train_steps(i: int, steps: int = 60) -> dict:
    """A tiny training run on the task's placement; returns where and when it ran."""
    import torch

    start = time.time()
    p = current_placement()
    enforce(p)
    device = torch.device(p.device)
    xs, ys = digits_tensors(device)
    model = mlp(64, i, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        idx = torch.randint(0, len(xs), (128,), device=device)
        loss = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    accuracy = float((model(xs).argmax(1) == ys).float().mean())
    return {"task": i, "devices": list(p.gpu_indices), "fraction": p.fraction, "memory": p.memory_cap,
            "start": start, "end": time.time(), "accuracy": accuracy}


DEFAULT_POOL = GpuPool(name="demo", simulated="2x16GiB")
MODES = ("process", "thread")
MAX_TASKS = 10_000  # training tasks of one demo run


VIEW = ExperimentView(
    "The pool demo: the GPU task runner placing plain torch tasks on slices of the pool (no scheduling system). "
    "Each task is a nested run with its slice; `tasks_wall_clock_s` is how long this machine took for all of them.",
    metrics=("tasks", "tasks_wall_clock_s"), params=("tasks", "steps", "mode", "pool"))


def identity(parameters: dict) -> RunIdentity:
    """Experiment ``gpuflows-pool`` (no system: the runner placing plain torch tasks); runs named by their task
    count, ``pool-20tasks-<time>``."""
    return RunIdentity("pool", (f"{parameters.get('tasks', 20)}tasks",))


def runner_settings(parameters: dict) -> dict:
    """The flow's GPU task runner from its own parameters (``pool``, ``mode``, ``tracking``); any entry point."""
    return settings(parameters, DEFAULT_POOL, identity(parameters).experiment)


@flow(name="pool-demo", log_prints=True, flow_run_name=run_namer(identity),
      task_runner=GpuTaskRunner(configure=runner_settings))
def pool_demo(tasks: int = 20, steps: int = 60, pool: GpuPool | str | None = None, mode: str = "process",
              tracking: MlflowTarget | bool | str | None = None) -> list[dict]:
    """Submit ``tasks`` training tasks with the request mix and return their placements.

    Args:
        tasks, steps: how many training tasks, and training steps per task.
        pool: GpuPool block, the name of a saved one, or None (pool "demo" on a simulated 2 x 16 GiB; on NVML GPUs
            the machine's one pool, "default").
        mode: GpuTaskRunner mode, "process" (CUDA_VISIBLE_DEVICES per task) or "thread".
        tracking: MlflowTarget block, the name of a saved one, False to switch MLflow off, None for the default target.
    """
    check(tasks, steps)
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose one of {MODES}")
    publish_mlflow_link()
    log_flow_inputs(identity({"tasks": tasks}), {"tasks": tasks, "steps": steps, "mode": mode,
                                                 "pool": pool if isinstance(pool, str) else getattr(pool, "name",
                                                                                                     "default")}, VIEW)
    futures = []
    for i in range(tasks):
        gpus, memory = MIX[i % len(MIX)]
        with gpu_options(gpus=gpus, memory=memory):
            futures.append(train_steps.with_options(name=f"train-{gpus:g}gpu").submit(i, steps))
    rows = []
    with FlowProgress("pool-demo", tasks, "pool demo", unit="tasks") as progress:
        for f in as_completed(futures):  # counted as they finish, not in submission order (1/20 after 8 done)
            rows.append(f.result())
            progress.advance()
    publish_pool_occupancy()
    return sorted(rows, key=lambda r: r["task"])


def check(tasks: int, steps: int) -> None:
    """The flow's parameters, checked by the flow and by ``main`` before it starts a flow run."""
    integer(tasks, "tasks", minimum=1, maximum=MAX_TASKS)
    integer(steps, "steps", minimum=1, maximum=MAX_COUNT)


def format_timeline(rows: list[dict], width: int = 60) -> str:
    """Text table of placements (``gpus``: the GPUs the task held, its per-device fraction times its devices)
    plus one Gantt line per GPU (a letter per task: A = task 0)."""
    t0 = min(r["start"] for r in rows)
    span = max(r["end"] for r in rows) - t0 or 1.0
    lines = [f"{'task':>4} {'gpus':>5} {'devices':>8} {'memory':>8} {'start s':>8} {'end s':>7} {'acc':>5}"]
    for r in sorted(rows, key=lambda r: r["start"]):
        mem = f"{r['memory'] / 2**30:.0f}GiB" if r["memory"] else "-"
        gpus = r["fraction"] * max(1, len(r["devices"]))
        lines.append(f"{r['task']:>4} {gpus:>5.2f} {','.join(map(str, r['devices'])) or 'cpu':>8} {mem:>8} "
                     f"{r['start'] - t0:>8.2f} {r['end'] - t0:>7.2f} {r['accuracy']:>5.2f}")
    devices = sorted({d for r in rows for d in r["devices"]})
    lines.append("")
    for d in devices:
        lane = [" "] * width
        for r in rows:
            if d in r["devices"]:
                a = int((r["start"] - t0) / span * (width - 1))
                b = max(a + 1, int((r["end"] - t0) / span * (width - 1)))
                for k in range(a, b):
                    lane[k] = chr(ord("A") + r["task"] % 26) if lane[k] == " " else "#"
        lines.append(f"gpu{d} |{''.join(lane)}|")
    lines.append(f"{'':5}letter = the task holding the device (A = task 0, B = task 1, ...); '#' = several at once")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = flow_parser("flows.pool_demo", __doc__)
    parser.add_argument("--tasks", type=int, default=20, help="number of tasks (default 20)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per task (default 60)")
    parser.add_argument("--mode", choices=MODES, default="process", help="runner mode")
    parser.add_argument("--pool", default=None, help="pool name (flows naming the same pool share it; default: "
                        "\"demo\" on simulated devices, the machine's one pool on real GPUs)")
    parser.add_argument("--simulated", type=simulated, default="2x16GiB", help="simulated devices when no GPU is found")
    parser.add_argument("--no-tracking", action="store_true", help="switch MLflow tracking off")
    args = parser.parse_args(argv)
    try:  # before a Prefect server starts
        check(args.tasks, args.steps)
        if args.pool:
            pool_path(args.pool)
    except GpuflowsError as exc:
        return error(exc)
    # None: the flow's default target, whose experiment is gpuflows-pool (a bare MlflowTarget() names "gpuflows")
    pool = GpuPool(name=args.pool or DEFAULT_POOL.name, simulated=args.simulated)
    rows = pool_demo(args.tasks, args.steps, pool=pool if args.pool else pool.on_this_machine(), mode=args.mode,
                     tracking=False if args.no_tracking else None)
    print(format_timeline(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
