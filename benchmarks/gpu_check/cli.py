"""The whole GPU path checked on this machine's CUDA devices, one line per check (``python -m benchmarks.gpu_check``).

Each check runs in a process of its own (``benchmarks.gpu_check.item``) under its time budget: one that fails,
crashes or hangs costs only its own line. Checks that run Prefect flows share one temporary Prefect server that
this command starts, and every check uses a fresh state folder (no saved packing curve, no existing pool ledger
is read). Without a CUDA device the command says so in one line and every check SKIPs (exit 0).

    python -m benchmarks.gpu_check [--quick] [--json OUT] [--only NAME ...] [--log FILE] [--budget-scale F]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from benchmarks.cli import benchmark_parser, finish
from benchmarks.gpu_check.items import ITEMS, QUICK_TOTAL_S, Item
from benchmarks.gpu_check.machine import probe
from benchmarks.gpu_check.report import Outcome, flat_json
from gpuflows.args import output_file

MIN_BUDGET_S = 5.0  # a check is not started with less time than this left of --quick's total
ENVIRONMENT = {  # as the Makefile sets them for every entry point
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
    "PREFECT_LOGGING_LEVEL": "WARNING", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def parser():
    ap = benchmark_parser(__doc__, f"smaller runs, and the whole command within {QUICK_TOTAL_S:.0f} s", seed=None)
    ap.add_argument("--only", action="append", choices=[item.name for item in ITEMS], metavar="NAME",
                    help=f"run only these checks (repeatable): {', '.join(item.name for item in ITEMS)}")
    ap.add_argument("--log", type=output_file, metavar="FILE",
                    help="where every check's own output goes (default: a file in the run's temporary folder)")
    ap.add_argument("--budget-scale", type=float, default=1.0, metavar="F",
                    help="multiply every check's time budget by F (a slow first start of the machine)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.budget_scale > 0:
        parser().error(f"--budget-scale {args.budget_scale}: must be > 0")
    started = time.perf_counter()
    items = [item for item in ITEMS if not args.only or item.name in args.only]
    machine = probe()
    print(f"gpu-check: {machine.describe()}")
    if not machine.cuda:
        print(f"gpu-check: no CUDA device here ({machine.why}): every device check SKIPs")
        outcomes = [Outcome(item.name, "SKIP", detail="no CUDA device") for item in items]
        for item, outcome in zip(items, outcomes):
            print(outcome.line(item.number))
    else:
        outcomes = run_all(items, args, started)
    print(f"gpu-check: {sum(o.status == 'PASS' for o in outcomes)} PASS, {sum(o.status == 'FAIL' for o in outcomes)} "
          f"FAIL, {sum(o.status == 'SKIP' for o in outcomes)} SKIP")
    finish(args, flat_json(outcomes, **machine.facts(), quick=args.quick), started)
    return 1 if any(o.status == "FAIL" for o in outcomes) else 0


def run_all(items: Sequence[Item], args, started: float) -> list[Outcome]:
    """Every check in its own process, one after the other (they would disturb each other's measurements)."""
    workdir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    log = Path(args.log) if args.log else workdir / "gpu_check.log"
    env = {**ENVIRONMENT, **os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "GPUFLOWS_STATE_DIR": str(workdir / "state"), "PREFECT_HOME": str(workdir / "prefect")}
    print(f"gpu-check: state, logs and scratch in {workdir}; each check's output in {log}")
    deadline = started + QUICK_TOTAL_S if args.quick else float("inf")
    outcomes = []
    with log.open("w") as out, prefect_api(env, any(item.prefect for item in items)) as api:
        for item in items:
            budget = min(item.budget(args.quick, args.budget_scale), deadline - time.perf_counter())
            if budget < MIN_BUDGET_S:
                outcome = Outcome(item.name, "FAIL", detail=f"not started: --quick's {QUICK_TOTAL_S:.0f} s were spent")
            elif item.prefect and api is None:
                outcome = Outcome(item.name, "FAIL", detail="no Prefect server could be started (see the log)")
            else:
                outcome = run_item(item, args.quick, budget, workdir / item.name, {**env, **(api or {})}, out)
            print(outcome.line(item.number), flush=True)
            outcomes.append(outcome)
    return outcomes


@contextmanager
def prefect_api(env: dict[str, str], needed: bool) -> Iterator[dict[str, str] | None]:
    """One temporary Prefect server for every check that runs flows (each would otherwise start its own);
    ``{"PREFECT_API_URL": ...}``, or None when it could not start. Nothing when no check needs it."""
    if not needed or env.get("PREFECT_API_URL"):
        yield {}
        return
    os.environ.update({k: v for k, v in env.items() if k.startswith("PREFECT_")})
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    try:
        server.start(timeout=90)
    except Exception as exc:  # noqa: BLE001 - the checks that need it FAIL saying so; the others still run
        print(f"gpu-check: the temporary Prefect server did not start: {exc!r}", file=sys.stderr)
        yield None
        return
    try:
        yield {"PREFECT_API_URL": server.api_url}
    finally:
        server.stop()


def run_item(item: Item, quick: bool, budget: float, workdir: Path, env: dict[str, str], log) -> Outcome:
    """Run one check's process (a session of its own, so its workers die with it) for at most ``budget`` s."""
    result = workdir / "outcome.json"
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "benchmarks.gpu_check.item", item.name, "--out", str(result),
               "--workdir", str(workdir), *(["--quick"] if quick else [])]
    log.write(f"\n===== {item.number} {item.name}: {' '.join(command)}\n")
    log.flush()
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    finally:
        if item.name == "mps":
            stop_mps_daemon(workdir)
    seconds = time.perf_counter() - started
    if code is None:
        return Outcome(item.name, "FAIL", detail=f"over its {budget:.0f} s budget: stopped", seconds=seconds)
    if not result.is_file():
        return Outcome(item.name, "FAIL", detail=f"its process exited {code} without an outcome (see the log)",
                       seconds=seconds)
    return Outcome.from_json(item.name, json.loads(result.read_text()))


def stop_mps_daemon(workdir: Path) -> None:
    """Quit an MPS control daemon the MPS check started under ``workdir`` and left running (it was stopped)."""
    from benchmarks.gpu_check.mps import quit_daemon

    quit_daemon(workdir)


if __name__ == "__main__":
    sys.exit(main())
