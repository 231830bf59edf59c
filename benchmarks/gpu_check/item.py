"""Run one check and write its outcome as JSON: ``python -m benchmarks.gpu_check.item NAME --out FILE [--quick]``.

The command line (``benchmarks.gpu_check.cli``) starts one such process per check, so a check that crashes,
hangs or leaves CUDA in a bad state takes no other check with it, and its budget can be enforced by killing
its process group. Whatever the check raises becomes its FAIL, with the exception in ``detail``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from benchmarks.gpu_check.items import BY_NAME, Settings
from benchmarks.gpu_check.report import Outcome


def run(name: str, settings: Settings) -> Outcome:
    """The check ``name``'s outcome; an exception it raises is its FAIL (the traceback goes to stderr)."""
    started = time.perf_counter()
    try:
        outcome = importlib.import_module(BY_NAME[name].module).check(settings)
    except Exception as exc:  # noqa: BLE001 - whatever broke is this check's failure, reported, not raised
        traceback.print_exc()
        outcome = Outcome(name, "FAIL", detail=f"{type(exc).__name__}: {exc}")
    return dataclasses.replace(outcome, seconds=time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("name", choices=sorted(BY_NAME))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    outcome = run(args.name, Settings(args.quick, args.workdir))
    args.out.write_text(json.dumps(outcome.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
