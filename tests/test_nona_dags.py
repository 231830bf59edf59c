"""Nona's DAGs from torch.fx traces (tasks/nona/dags.py) are the shipped profile's (gpu/sim/nona/profile_cpu.json)."""

from __future__ import annotations

import pytest

from gpu.schedulers.nona.dag import contract
from gpu.sim.nona.workloads import paper_models


@pytest.mark.slow
def test_traced_resnet18_is_the_shipped_profiles_graph_with_its_bytes_and_measured_times():
    pytest.importorskip("torch")
    from tasks.nona.dags import profile_models

    traced = profile_models(["resnet18"], repeats=1)["resnet18"]
    shipped = paper_models()["resnet18"]
    assert traced.tasks == shipped.tasks and len(traced.tasks) == 71  # Table II
    assert traced.bytes == shipped.bytes  # ShapeProp's activation bytes, edge by edge
    ours = contract(traced)
    assert (len(ours.dag.tasks), ours.rounds) == (10, 2)
    convs = [p for t, p in zip(traced.tasks, traced.ops) if "conv" in t]
    assert all(p > 0 for p in convs) and sum(convs) > 0.5 * traced.total_ops  # the convolutions carry the time
