"""Nona's query DAGs from real torch models: ``torch.fx`` operator graphs with measured activation bytes.

The paper takes its DAGs from PipeDream's profiler (§IV-A). We trace a model with ``torch.fx`` instead, so
every operator (placeholder and output included) is one task. ``ShapeProp`` runs one forward pass on an
example input and records each node's output tensor, and an edge's ``b`` is the byte size of the tensor its
producer hands over. A task's ``p`` is its FLOPs, counted with ``torch.utils.flop_counter`` while the node
runs. Operators that do no matrix work (norms, activations, adds) count one operation per output
element. The resulting ``gpu.schedulers.nona.dag.Dag`` is what ``contract`` and the solver take.

torchvision is not installed here (a build for this torch would replace torch itself), so ``resnet18``
rebuilds torchvision's ResNet18 (BasicBlock ×[2, 2, 2, 2], random weights) with the same module layout:
``torch.fx`` traces it to the same 71 nodes.
"""

from __future__ import annotations

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp
from torch.utils.flop_counter import FlopCounterMode

from gpu.schedulers.nona.dag import Dag


class _Block(nn.Module):
    """torchvision's ``BasicBlock``: two 3×3 convolutions and a skip (a 1×1 downsample when shapes change)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision's ResNet18 layout (He et al., 2016), 1000 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, cin = (64, 128, 256, 512), 64
        for i, cout in enumerate(widths, start=1):
            stride = 1 if i == 1 else 2
            setattr(self, f"layer{i}", nn.Sequential(_Block(cin, cout, stride), _Block(cout, cout, 1)))
            cin = cout
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class _Profile(fx.Interpreter):
    """Runs the traced graph once, counting each node's FLOPs (``ShapeProp`` has already stored the shapes)."""

    def __init__(self, module: fx.GraphModule):
        super().__init__(module)
        self.flops: dict[str, float] = {}

    def run_node(self, n: fx.Node):
        counter = FlopCounterMode(display=False)
        with counter:
            out = super().run_node(n)
        matrix = float(counter.get_total_flops())
        self.flops[n.name] = matrix if matrix > 0 else float(out.numel()) if isinstance(out, torch.Tensor) and \
            n.op not in ("placeholder", "output") else 0.0
        return out


def fx_dag(model: nn.Module, example: torch.Tensor, name: str) -> Dag:
    """The model's operator DAG: one task per ``torch.fx`` node, ``p`` = FLOPs, ``b`` = output bytes."""
    gm = fx.symbolic_trace(model.eval())
    with torch.no_grad():
        ShapeProp(gm).propagate(example)
        profile = _Profile(gm)
        profile.run(example)
    ops = {n.name: profile.flops[n.name] for n in gm.graph.nodes}
    edges = {}
    for n in gm.graph.nodes:
        meta = n.meta.get("tensor_meta")
        size = float(torch.Size(meta.shape).numel() * torch.empty((), dtype=meta.dtype).element_size()) if meta else 0.0
        for user in n.users:
            edges[(n.name, user.name)] = size
    return Dag.build(name, ops, edges)
