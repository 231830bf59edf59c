"""Nona's query DAGs from real torch models: ``torch.fx`` operator graphs, each operator timed, each edge's bytes.

The paper takes its DAGs and per-layer profiles from PipeDream's profiler (§IV-A) and publishes neither. We
trace a model with ``torch.fx`` instead, so every operator (placeholder and output included) is one task:

* an edge's ``b`` is the byte size of the tensor its producer hands over (``ShapeProp`` on an example input);
* a task's ``p`` is its measured compute time in seconds: the median over ``repeats`` forward passes of the
  thread CPU time the operator took (``time.thread_time_ns``; torch runs on the calling thread with one intra-op
  thread), so other processes on a shared machine do not inflate it the way they inflate wall time. A server
  of ν = 1 runs the task in that time.

Nodes that no input reaches (parameters read as ``get_attr``, constants built from them) are weights every
server holds, not part of a query's data flow: they are left out, with their edges.

``profile_models`` measures the five classes of ``tasks.nona.models.PAPER_MODELS`` and ``write_profile`` stores
them as the JSON that ``gpu.sim.nona.workloads`` reads (regenerate with ``python -m tasks.nona.profile``).
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any, Sequence

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from gpu.schedulers.nona.dag import Dag
from tasks.nona.models import PAPER_MODELS


class _Timer(fx.Interpreter):
    """Runs the traced graph, adding each node's thread CPU time (ns) to ``times``."""

    def __init__(self, module: fx.GraphModule):
        super().__init__(module)
        self.times: dict[str, list[int]] = {n.name: [] for n in module.graph.nodes}

    def run_node(self, n: fx.Node) -> Any:
        t0 = time.thread_time_ns()
        out = super().run_node(n)
        self.times[n.name].append(time.thread_time_ns() - t0)
        return out


def _nbytes(node: fx.Node) -> float:
    meta = node.meta.get("tensor_meta")
    if not hasattr(meta, "shape"):  # a tuple, a size, or nothing: no tensor handed over
        return 0.0
    return float(torch.Size(meta.shape).numel() * torch.empty((), dtype=meta.dtype).element_size())


def fx_dag(model: nn.Module, example: torch.Tensor, name: str, repeats: int = 5, warmup: int = 1) -> Dag:
    """The model's operator DAG: one task per ``torch.fx`` node an input reaches, ``p`` = its median thread CPU
    seconds over ``repeats`` passes (after ``warmup``), ``b`` = the bytes of the tensor on each edge."""
    gm = fx.symbolic_trace(model.eval())
    with torch.inference_mode():
        ShapeProp(gm).propagate(example)
        timer = _Timer(gm)
        for _ in range(warmup):
            timer.run(example)
        timer.times = {k: [] for k in timer.times}
        for _ in range(repeats):
            timer.run(example)
    reached: set[str] = set()
    for n in gm.graph.nodes:  # topological: an input, or a node fed by a reached one
        if n.op == "placeholder" or any(a.name in reached for a in n.all_input_nodes):
            reached.add(n.name)
    ops = {n.name: statistics.median(timer.times[n.name]) / 1e9 for n in gm.graph.nodes if n.name in reached}
    edges = {(n.name, user.name): _nbytes(n) for n in gm.graph.nodes if n.name in reached
             for user in n.users if user.name in reached}
    return Dag.build(name, ops, edges)


def profile_models(names: Sequence[str] | None = None, repeats: int = 5, seed: int = 0) -> dict[str, Dag]:
    """The measured DAG of each of the paper's classes (``PAPER_MODELS``), on this machine's CPU, one thread."""
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for name in names or PAPER_MODELS:
            make, example = PAPER_MODELS[name]
            out[name] = fx_dag(make(), example(), name, repeats)
        return out
    finally:
        torch.set_num_threads(threads)


def _cpu_name() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``), else the platform's machine type."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profile_document(dags: dict[str, Dag], repeats: int, command: str) -> dict[str, Any]:
    """The JSON ``gpu.sim.nona.workloads.load_profile`` reads: per class, task seconds and edge bytes, and
    where and how they were measured."""
    return {
        "about": {"measured": "thread CPU time per torch.fx node, median of repeats, batch 1, one intra-op thread",
                  "units": {"tasks": "s", "edges": "bytes"}, "repeats": repeats, "command": command,
                  "cpu": _cpu_name(), "torch": torch.__version__,
                  "date": time.strftime("%Y-%m-%d")},
        "classes": {name: {"tasks": {t: float(f"{p:.6g}") for t, p in zip(d.tasks, d.ops)},
                           "edges": [[a, b, int(s)] for a, b, s in d.edges]} for name, d in dags.items()},
    }
