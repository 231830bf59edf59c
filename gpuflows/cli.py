"""``gpuflows``: simulate a system on a scenario, inspect the pool, run the demo.

Subcommands import their heavy dependencies lazily so ``gpuflows --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from gpu.devices import discover
from gpu.errors import GpuflowsError
from gpu.pool import open_pool, pool_names, read_pool
from gpu.systems import SYSTEMS
from gpuflows.args import output_file, simulated


def _simulate(args: argparse.Namespace) -> int:
    report = SYSTEMS[args.system].run(args.scenario, args.policy or None)
    print(report.format())
    if args.json:
        report.write_json(args.json)
        print(f"\nwrote {args.json}")
    return 0


def _devices(args: argparse.Namespace) -> int:
    pool = discover(args.simulate)
    for node in pool.nodes:
        for d in node.devices:
            print(f"{node.name}  {d.describe()}")
    if not pool.gpu_count:
        print("no NVIDIA GPU visible through NVML on this machine (flows then use simulated devices; "
              "`gpuflows devices --simulate 2x16GiB` lists those)")
    return 0


def _pool(args: argparse.Namespace) -> int:
    if args.list:
        pools = [read_pool(name) for name in pool_names()]
        for p in pools:
            print(f"{p.name}  {p.layout()}  {p.leases} lease(s), {p.waiting} waiting")
        if not pools:
            print("no pools yet: a flow run creates its pool's ledger")
        return 0
    from gpu.schedulers.salus import live

    ledger = open_pool(args.name)  # with the layout it was stored with
    for line in ledger.describe():
        print(line)
    for status in live.executors(args.name):  # a Salus executor's device is one lease above: its lanes inside
        for line in live.describe(status):
            print(line)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from flows.demo import main as demo_main

    return demo_main(args.extra)


def _policy_epilog() -> str:
    """Each system's policies and shipped example, for ``gpuflows simulate --help``."""
    lines = ["policies (--policy; <...> is filled in from the scenario):"]
    for name, entry in sorted(SYSTEMS.items()):
        lines.append(f"  {name:<9} {', '.join(entry.policy_names())}")
        lines.append(f"  {'':<9} example: gpuflows simulate {name} {entry.example}")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog is computed only when help is shown (listing every system's
    policies imports its engine; ``gpuflows pool`` should not pay for that)."""

    epilog_factory: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.epilog_factory is not None:
            self.epilog = self.epilog_factory()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuflows", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sim = sub.add_parser("simulate", help="run a system's simulator on a scenario file and print a table",
                         description="Run a system's simulator on a scenario file and print a table.",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    sim.epilog_factory = _policy_epilog
    sim.add_argument("system", choices=sorted(SYSTEMS), help="which system's simulator")
    sim.add_argument("scenario", help="scenario file (JSON or YAML; format in docs/<system>.md, examples in scenarios/<system>/)")
    sim.add_argument("--policy", action="append", help="policy to run (repeatable); default: all the system's policies")
    sim.add_argument("--json", type=output_file, metavar="OUT", help="also write the figures as JSON to OUT")
    sim.set_defaults(func=_simulate)

    dev = sub.add_parser("devices", help="list the GPUs found through NVML (or the simulated ones)")
    dev.add_argument("--simulate", type=simulated, default=None,
                     help="simulated devices when NVML finds none, e.g. '4x16GiB'")
    dev.set_defaults(func=_devices)

    pool = sub.add_parser("pool", help="show a shared pool's devices, leases and ephemeral resources, and the lanes "
                                       "and token holders of its running Salus executors")
    pool.add_argument("--name", default="default", help="pool name (the ledger file under the state folder)")
    pool.add_argument("--list", action="store_true", help="list the pools with their layout and lease counts")
    pool.set_defaults(func=_pool)

    demo = sub.add_parser("demo", add_help=False,  # `gpuflows demo --help` is the demo's own help
                          help="run the demo (make demo): the pool demo, then Ekya thief vs uniform on a simulated 2-GPU pool")
    demo.add_argument("extra", nargs=argparse.REMAINDER, help="arguments passed to the demo")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "demo":  # its options pass through as given ("--seed -1" had come out as "-1 --seed")
        args.extra = argv[argv.index("demo") + 1:]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args)
    except GpuflowsError as exc:
        print(f"gpuflows: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
