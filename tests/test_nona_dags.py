"""Nona's DAGs from torch.fx traces (tasks/nona/dags.py) agree with the engine's generated workloads."""

from __future__ import annotations

import pytest

from gpu.schedulers.nona.dag import contract
from gpu.sim.nona.workloads import resnet18_graph


@pytest.mark.slow
def test_traced_resnet18_has_table_2s_71_nodes_and_the_generated_graphs_bytes_and_flops():
    torch = pytest.importorskip("torch")
    from tasks.nona.dags import ResNet18, fx_dag

    traced = fx_dag(ResNet18(), torch.randn(1, 3, 224, 224), "resnet18")
    generated = resnet18_graph()
    assert len(traced.tasks) == len(generated.tasks) == 71
    ours, theirs = contract(traced), contract(generated)
    assert (len(ours.dag.tasks), ours.rounds) == (10, 2)
    assert sorted(ours.dag.bytes.values()) == sorted(theirs.dag.bytes.values())  # ShapeProp's activation bytes
    assert sum(traced.ops) == pytest.approx(sum(generated.ops), rel=0.01)      # FLOPs counted vs from shapes
