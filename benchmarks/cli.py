"""The command line every benchmark shares: ``--quick``, ``--json OUT``, and ``--seed N`` / ``--plots DIR`` where
the benchmark has them, so each script reads the same and a mistyped ``--json`` folder fails before the run.

    ap = benchmark_parser(__doc__, "2 windows instead of 5", seed=0, plots="ekya")
    ap.add_argument("--hidden", type=int, default=64)   # a benchmark's own options go on top
    args = ap.parse_args(argv)
    started = time.perf_counter()
    ...                                                  # the run: figures = {"thief_mean_accuracy": 0.77, ...}
    return finish(args, figures, started)                # prints the runtime, writes --json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Mapping

from gpuflows.args import output_file

ROOT = Path(__file__).resolve().parents[1]


def plots_folder(system: str) -> Path:
    """Where a benchmark's PNG plots go unless ``--plots`` says otherwise: ``.state/benchmarks/<system>``."""
    return ROOT / ".state" / "benchmarks" / system


def benchmark_parser(doc: str, quick: str, *, seed: int | None = 0, plots: str | None = None,
                     ) -> argparse.ArgumentParser:
    """The parser with the shared options; the description is the first line of the script's docstring.

    Args:
        doc: the benchmark's module docstring.
        quick: what ``--quick`` leaves out (its help line).
        seed: the default of ``--seed``; None for a benchmark without one.
        plots: the system whose plot folder is the default of ``--plots`` (:func:`plots_folder`); None for a
            benchmark that draws nothing.
    """
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--json", metavar="OUT", type=output_file, help="write the figures as a flat JSON object")
    if seed is not None:
        ap.add_argument("--seed", type=int, default=seed)
    if plots is not None:
        ap.add_argument("--plots", metavar="DIR", type=Path, default=plots_folder(plots),
                        help=f"where the PNG plots go (default {plots_folder(plots).relative_to(ROOT)})")
    return ap


def finish(args: argparse.Namespace, figures: Mapping[str, Any], started: float) -> int:
    """The end of a run: its wall time since ``started`` (``time.perf_counter()``), quick or full and the seed,
    then the JSON; returns the exit status."""
    seed = f", seed {args.seed}" if "seed" in args else ""
    print(f"\nruntime {time.perf_counter() - started:.1f} s ({'quick' if args.quick else 'full'}{seed})")
    write_json(args.json, figures)
    return 0


def write_json(path: str | Path | None, figures: Mapping[str, Any]) -> None:
    """Write ``figures`` as a flat JSON object to ``path`` when one was given (numpy scalars as numbers)."""
    if path:
        Path(path).write_text(json.dumps(dict(figures), indent=2, default=float))
        print(f"wrote {path}")
