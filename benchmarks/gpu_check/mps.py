"""Check 3: CUDA MPS makes a compute share real (``tasks.runtime.slices.mps_environment``).

A slice's compute share is only a scheduling promise unless an MPS control daemon serves the process and the
process starts CUDA with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` set to its share. This check starts a daemon of its
own (``nvidia-cuda-mps-control -d`` with a private pipe folder, so it touches no daemon already running and
changes no device setting), then measures two things:

* the mechanism: the yardstick kernel (``kernels``, compute-bound bf16 products) in processes started with
  ``mps_environment(f)`` for f = 0.25, 0.5, 1: its rate should follow f;
* the runner: ``gpus=0.25`` and ``gpus=0.5`` tasks under ``GpuTaskRunner`` (process mode) with the daemon
  running: each must start with the percentage of its slice, and its measured rate follow it.

Where no daemon can be started (no binary, no permission, a container without MPS), the check SKIPs saying why.
The daemon is told to quit when the check ends (and by the command line if the check was stopped).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prefect import flow

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.report import Outcome, verdict
from benchmarks.gpu_check.work import slice_task
from tasks.runtime.slices import MPS_PIPE_ENV, MPS_THREADS_ENV, mps_available, mps_environment

CONTROL = "nvidia-cuda-mps-control"
FRACTIONS = (0.25, 0.5, 1.0)
TOLERANCE = 0.5  # a rate "follows" share f when it is within f x (1 +- 0.5) of the whole device's
PIPE, LOGS = "mps-pipe", "mps-log"
KERNEL = ("--size", "8192", "--iterations", "20")


def daemon_env(workdir: Path) -> dict[str, str]:
    """The environment that points CUDA and the control program at this check's daemon."""
    return {MPS_PIPE_ENV: str(workdir / PIPE), "CUDA_MPS_LOG_DIRECTORY": str(workdir / LOGS)}


def start_daemon(workdir: Path) -> str | None:
    """Start an MPS control daemon under ``workdir``; None once its control socket is up, else why not."""
    binary = shutil.which(CONTROL)
    if binary is None:
        return f"{CONTROL} is not on PATH"
    env = daemon_env(workdir)
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    started = subprocess.run([binary, "-d"], env={**os.environ, **env}, capture_output=True, text=True, timeout=20)
    if started.returncode != 0:
        return f"{CONTROL} -d exited {started.returncode}: {(started.stderr or started.stdout).strip()[:120]}"
    for _ in range(50):
        if (workdir / PIPE / "control").exists():
            return None
        time.sleep(0.1)
    return f"{CONTROL} -d left no control socket in {workdir / PIPE} within 5 s ({_log_tail(workdir)})"


def _log_tail(workdir: Path) -> str:
    log = workdir / LOGS / "control.log"
    lines = log.read_text().strip().splitlines() if log.is_file() else []
    return lines[-1][:120] if lines else "no control log"


def quit_daemon(workdir: Path) -> None:
    """Tell the daemon under ``workdir`` to quit (nothing if none runs there)."""
    binary = shutil.which(CONTROL)
    if binary is None or not (workdir / PIPE / "control").exists():
        return
    subprocess.run([binary], input="quit\n", env={**os.environ, **daemon_env(workdir)}, capture_output=True,
                   text=True, timeout=30)


def kernel_rate(fraction: float, workdir: Path) -> tuple[float | None, str]:
    """The yardstick's TFLOP/s in a process started as the runner should start a worker on a ``fraction`` slice
    (``mps_environment``); (None, why) when CUDA would not start there."""
    env = {**os.environ, **daemon_env(workdir)}
    env.pop(MPS_THREADS_ENV, None)
    env.update(mps_environment(fraction))
    run = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check.kernels", *KERNEL], env=env,
                         capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        return None, (run.stderr.strip().splitlines() or ["no output"])[-1][:140]
    return float(json.loads(run.stdout.strip().splitlines()[-1])["tflops"]), ""


@flow(name="gpu-check-mps")
def mps_flow(quick: bool) -> list[dict[str, Any]]:
    """One task per fractional share, one after the other (each alone on the device while it measures)."""
    from tasks.runtime.requests import gpu_options

    out = []
    for fraction in FRACTIONS[:-1]:
        with gpu_options(gpus=fraction):
            out.append(slice_task.submit(0.25, 20, size=8192).result())
    return out


def follows(rates: dict[float, float]) -> list[str]:
    """The shares whose rate is off ``f`` x the whole device's rate by more than ``TOLERANCE``."""
    whole = rates[1.0]
    return [f"{f:g}: {rates[f] / whole:.2f} of the whole device" for f in FRACTIONS[:-1]
            if abs(rates[f] / whole - f) > TOLERANCE * f]


def check(settings: Settings) -> Outcome:
    workdir = settings.workdir
    why = start_daemon(workdir)
    if why is not None:
        return Outcome("mps", "SKIP", detail=f"no MPS daemon: {why}")
    before = {key: os.environ.get(key) for key in daemon_env(workdir)}
    try:
        os.environ.update(daemon_env(workdir))  # this process and the runner's workers see the daemon
        rates: dict[float, float] = {}
        for fraction in FRACTIONS:
            rate, failed = kernel_rate(fraction, workdir)
            if rate is None:
                return Outcome("mps", "SKIP", detail=f"the daemon runs but CUDA does not start under it: {failed}")
            rates[fraction] = rate
        from resource_blocks import GpuPool
        from tasks.runtime.runners import GpuTaskRunner

        runner = GpuTaskRunner(pool=GpuPool(name="gpu-check-mps", device_backend="nvml"), mode="process",
                               tracking=False)
        tasks = mps_flow.with_options(task_runner=runner)(settings.quick)
        return judge(rates, tasks, mps_available())
    finally:
        quit_daemon(workdir)
        for key, value in before.items():  # later work in this process (a test session) runs without MPS
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def judge(rates: dict[float, float], tasks: list[dict[str, Any]], available: bool) -> Outcome:
    """The mechanism's rates must follow the shares; the runner's tasks must start with their percentage and follow."""
    failures = []
    if not available:
        failures.append("slices.mps_available() does not see the running daemon")
    off = follows(rates)
    if off:
        failures.append(f"MPS rates off their share: {', '.join(off)}")
    runner_rates = {1.0: rates[1.0]}
    for r in tasks:
        expected = mps_environment(r["fraction"]).get(MPS_THREADS_ENV)
        runner_rates[r["fraction"]] = r["tflops"]
        if r["mps_threads"] != expected:
            failures.append(f"a gpus={r['fraction']:g} task started with {MPS_THREADS_ENV}={r['mps_threads']} "
                            f"(its slice: {expected})")
    off = follows(runner_rates)
    if off:
        failures.append(f"runner tasks' rates off their share: {', '.join(off)}")
    shares = ", ".join(f"{f:g}->{rates[f] / rates[1.0]:.2f}" for f in FRACTIONS[:-1])
    ran = ", ".join(f"{r['fraction']:g}->{r['tflops'] / rates[1.0]:.2f}" for r in tasks)
    figure = f"MPS rate share {shares} (whole {rates[1.0]:.0f} TFLOP/s); runner tasks {ran}"
    figures = {**{f"tflops_{int(100 * f)}": v for f, v in rates.items()},
               **{f"runner_tflops_{int(100 * r['fraction'])}": r["tflops"] for r in tasks},
               **{f"runner_threads_{int(100 * r['fraction'])}": r["mps_threads"] for r in tasks}}
    return verdict("mps", failures, figure, figures)
