"""``make demo`` / ``gpuflows demo``: the GPU pool demo, then Ekya's thief against the uniform
baseline on the same drifting streams and a simulated 2-GPU pool.

    gpuflows demo                       # pool demo + 4 streams x 3 windows, thief vs uniform
    python -m flows.demo --skip-pool-demo --mode process

The Ekya runs use the runner's thread mode by default: their ~100 tasks each do milliseconds of
torch work, and on a 2-core machine process-mode dispatch (spawned workers per device set,
pickled tasks) made the comparison take ~10 minutes instead of ~2 (measured 2026-11-22).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time

from flows.continuous_retraining import MODES, continuous_retraining, format_summary, prepare
from gpu.errors import GpuflowsError
from gpuflows.args import error, flow_arguments, simulated
from resource_blocks import GpuPool
from tasks.runtime.flow import where_runs_went


def comparison_table(summaries: dict[str, dict]) -> str:
    """Measured mean accuracy per window and overall, one column per policy."""
    policies = list(summaries)
    windows = len(next(iter(summaries.values()))["windows"])
    lines = ["measured mean accuracy   " + "  ".join(f"{p:>8s}" for p in policies)]
    for w in range(windows):
        lines.append(f"  window {w:<16d}" + "  ".join(f"{summaries[p]['windows'][w]['mean']:8.3f}" for p in policies))
    lines.append(f"  {'all windows':<23s}" + "  ".join(f"{summaries[p]['mean_accuracy']:8.3f}" for p in policies))
    if {"thief", "uniform"} <= set(policies):
        gain = summaries["thief"]["mean_accuracy"] - summaries["uniform"]["mean_accuracy"]
        lines.append(f"thief - uniform: {gain:+.3f} ({100 * gain:+.1f} accuracy points)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuflows demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=4, help="drifting streams (default 4)")
    parser.add_argument("--windows", type=int, default=3, help="retraining windows (default 3)")
    parser.add_argument("--mode", choices=MODES, default="thread", help="GPU task runner mode (default thread)")
    parser.add_argument("--simulated", type=simulated, default="2x16GiB", help="simulated pool (default 2x16GiB)")
    parser.add_argument("--seed", type=int, default=0, help="drift, golden model and training seed (default 0)")
    parser.add_argument("--skip-pool-demo", action="store_true", help="run only the Ekya comparison")
    args = parser.parse_args(argv)
    pool = GpuPool(name="ekya-demo", device_backend="simulated", simulated=args.simulated)
    runs = {policy: flow_arguments(continuous_retraining, streams=args.streams, windows=args.windows, policy=policy,
                                   pool=pool, seed=args.seed, mode=args.mode, registry_prefix=f"ekya-demo-{policy}")
            for policy in ("thief", "uniform")}
    try:  # every run's arguments, before the first flow run starts
        for kwargs in runs.values():
            prepare(**kwargs)
    except GpuflowsError as exc:
        return error(exc)

    started = time.perf_counter()
    if not args.skip_pool_demo and importlib.util.find_spec("flows.pool_demo") is not None:
        print("== GPU pool demo (flows.pool_demo) ==")
        code = importlib.import_module("flows.pool_demo").main([])
        if code:
            return code
    summaries = {}
    for policy, kwargs in runs.items():
        print(f"\n== Ekya continuous retraining, policy={policy}: {args.streams} streams, {args.windows} windows, "
              f"simulated {args.simulated} pool ==")
        summaries[policy] = continuous_retraining(**kwargs)
        print(format_summary(summaries[policy]))
        print(f"accuracy plot: {summaries[policy]['plot']}")
    print("\n" + comparison_table(summaries))
    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s")
    print(where_runs_went())
    return 0


if __name__ == "__main__":
    sys.exit(main())
