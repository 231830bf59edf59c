"""Command-line argument types and error reporting shared by ``gpuflows`` and the flows' ``python -m flows.<name>``
entry points: bad arguments stop a command before any Prefect flow run starts, with one line naming them."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Callable

from gpu.devices import parse_simulated
from gpu.errors import ConfigError, GpuflowsError


def output_file(path: str) -> str:
    """An output path whose folder exists: checked when the arguments are parsed, so a typo fails at once and
    not after the whole simulation or flow run has finished."""
    folder = Path(path).expanduser().resolve().parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{path!r}: folder {folder} does not exist")
    return path


def simulated(spec: str) -> str:
    """``--simulated``/``--simulate`` devices (COUNT x MEMORY within ``gpu.devices``' bounds, at least one device: a
    pool of none holds no task), checked when the arguments are parsed: the pool is only built once the flow runs,
    and on a GPU machine not at all."""
    try:
        if not parse_simulated(spec).devices:
            raise ConfigError("simulated", spec, "a pool needs at least one device")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return spec


def flow_arguments(flow: Any, **given: Any) -> dict[str, Any]:
    """``given`` plus the flow's defaults for the rest: exactly what a run of ``flow(**given)`` gets, for an entry
    point to check before it starts the run."""
    call = inspect.signature(flow.fn).bind(**given)
    call.apply_defaults()
    return dict(call.arguments)


def error(exc: Exception) -> int:
    """Report a bad argument found after parsing (``field=value: why``); 2 is argparse's status for bad usage."""
    print(f"error: {exc}", file=sys.stderr)
    return 2


def add_runner_arguments(parser: argparse.ArgumentParser, modes: tuple[str, ...], pool: str | None,
                         simulated_devices: str, mode: str = "process") -> None:
    """The arguments a flow's command line ends with, spelled the same in every flow: ``--pool`` (a pool name,
    ``pool``; None: a saved GpuPool block, else the flow's own simulated pool), ``--simulated`` devices (used when no
    GPU is found), the task runner's ``--mode`` (one of ``modes``) and ``--no-tracking``."""
    parser.add_argument("--pool", default=pool, help="pool name (flows naming the same pool share it)" if pool else
                        "saved GpuPool block name (default: the flow's own pool, simulated when no GPU is found; "
                        "on real GPUs the machine's one pool, 'default')")
    parser.add_argument("--simulated", type=simulated, default=simulated_devices,
                        help=f"simulated devices when no GPU is found (default {simulated_devices})")
    parser.add_argument("--mode", default=mode, help=f"runner mode, one of {modes} (default {mode})")
    parser.add_argument("--no-tracking", action="store_true", help="switch MLflow tracking off")


def flow_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``: its ``--help`` is the module docstring's first paragraph, the options,
    then the docstring's example commands; the rest of the docstring (the 30-50 lines that explain the flow) is
    the module's own documentation, pointed to, not printed before the options."""
    paragraphs = [p.strip() for p in (doc or "").split("\n\n") if p.strip()]
    examples = [line.strip() for line in (doc or "").splitlines() if line.strip().startswith("python -m ")]
    epilog = "\n".join(["examples:", *(f"  {e}" for e in examples), ""] if examples else [])
    epilog += f"the flow in full: python -c 'import {module}; help({module})'"
    return argparse.ArgumentParser(prog=f"python -m {module}", description=paragraphs[0] if paragraphs else None,
                                   epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def report(text: str, summary: dict[str, Any], json_path: str | None) -> int:
    """A flow command's ending: print ``text`` (its summary as a table) and, with ``--json OUT``, write ``summary``
    there too (values JSON cannot hold, e.g. timestamps, as strings). Returns the exit status, 0."""
    print(text)
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2, default=str))
    return 0


def run_checked(flow: Any, prepare: Callable[..., tuple], kwargs: dict[str, Any], summarise: Callable[[dict], str],
                json_path: str | None) -> int:
    """Run a flow from its command line: ``prepare(**kwargs)`` checks every argument and settles the pool and MLflow
    target (its first two results) before any flow run starts, then the flow runs and its summary is ``report``-ed.
    Returns the exit status: 2 with one line naming a bad argument, else 0."""
    try:
        kwargs["pool"], kwargs["tracking"], *_ = prepare(**kwargs)
        summary = flow(**kwargs)
    except GpuflowsError as exc:
        return error(exc)
    return report(summarise(summary), summary, json_path)
