"""Command-line argument types shared by ``gpuflows`` and the flows' ``python -m flows.<name>`` entry points."""

from __future__ import annotations

import argparse
from pathlib import Path


def output_file(path: str) -> str:
    """An output path whose folder exists: checked when the arguments are parsed, so a typo fails at once and
    not after the whole simulation or flow run has finished."""
    folder = Path(path).expanduser().resolve().parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{path!r}: folder {folder} does not exist")
    return path
