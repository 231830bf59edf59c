"""Measure the paper's five query classes on this machine and write the profile the simulator reads.

    python -m tasks.nona.profile [--out gpu/sim/nona/profile_cpu.json] [--repeats 5] [--models gpt2 resnet18 ...]

Each class is traced with ``torch.fx`` and every operator timed (``tasks.nona.dags``: median thread CPU time over
the repeats, one intra-op thread, batch 1); edges carry the bytes of the tensors they hand over. The shipped file
``gpu/sim/nona/profile_cpu.json`` was written by this command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tasks.nona.dags import profile_document, profile_models
from tasks.nona.models import PAPER_MODELS

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "gpu" / "sim" / "nona" / "profile_cpu.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tasks.nona.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="profile JSON to write (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="timed forward passes per model (median per operator)")
    ap.add_argument("--models", nargs="+", choices=sorted(PAPER_MODELS), default=list(PAPER_MODELS))
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    dags = profile_models(args.models, args.repeats)
    command = "python -m tasks.nona.profile " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.write_text(json.dumps(profile_document(dags, args.repeats, command.strip()), indent=1) + "\n")
    for name, dag in dags.items():
        print(f"{name:12s} {len(dag.tasks):4d} operators, {1e3 * dag.total_ops:8.1f} ms, "
              f"{sum(b for *_, b in dag.edges) / 1e6:7.1f} MB on edges")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
