"""The query classes of Nona's evaluation (§IV-A, Table II), as measured on this machine, and §II's query.

The paper profiles GPT2, DenseNet121, VGG16, AlexNet and ResNet18 with PipeDream and publishes neither the
per-layer times nor the transfer sizes. ``profile_cpu.json`` beside this module holds ours: each model's
``torch.fx`` operator graph with every operator's measured compute time (s, thread CPU time on one core of this
machine, batch 1) and every edge's activation bytes (``tasks.nona.dags``; regenerate with
``python -m tasks.nona.profile``). ``paper_models`` reads it (no torch needed here): a task's ``p`` is seconds,
so a server of ν = 1 runs it in the measured time.

``motivating_query`` is §II's f(A, B) = det(A+B) + det(r(A+B)) with Fig. 1's times in ms (our choice, the paper
gives totals only: 100 MB on det's edges, 10 MB on the sparse det's), ops in ms of compute at ν = 1000 ops/s.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from gpu.errors import ConfigError
from gpu.schedulers.nona.dag import Dag

PROFILE = Path(__file__).resolve().parent / "profile_cpu.json"


@functools.lru_cache(maxsize=4)
def load_profile(path: str | Path = PROFILE) -> dict[str, Any]:
    """The profile document (``about`` and ``classes``) at ``path``; a missing or malformed one is a ConfigError."""
    try:
        doc = json.loads(Path(path).read_text())
        doc["classes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("profile", str(path), f"not a Nona profile (python -m tasks.nona.profile writes one): {exc}")
    return doc


def paper_models(path: str | Path = PROFILE) -> dict[str, Dag]:
    """The five inference classes of §IV-A, uncontracted: ops in measured seconds, edges in bytes."""
    return {name: Dag.build(name, c["tasks"], {(a, b): size for a, b, size in c["edges"]})
            for name, c in load_profile(path)["classes"].items()}


def motivating_query() -> Dag:
    """§II, Fig. 1: ``sum`` (A+B, 1 ms) → ``det`` (10 ms, 100 MB edges) ∥ ``det_sparse`` (10 ms, 10 MB) → ``add``."""
    mb = 1e6
    return Dag.build("f", {"sum": 1.0, "det": 10.0, "det_sparse": 10.0, "add": 1.0},
                     {("sum", "det"): 100 * mb, ("det", "add"): 100 * mb,
                      ("sum", "det_sparse"): 10 * mb, ("det_sparse", "add"): 10 * mb})
