"""The five inference models of Nona's evaluation (§IV-A, Table II) as plain torch modules, random weights.

GPT2, DenseNet121, VGG16, AlexNet and ResNet18, in the module layouts of torchvision and of GPT-2 small
(Radford et al., 2019), so that ``torch.fx`` traces the operator graphs the paper's DAGs come from (the paper
uses PipeDream's profiler). torchvision and transformers are not installed here (a torchvision build for this
torch would replace torch itself), so the layouts are rebuilt; timings do not depend on the weights.

* ``ResNet18``: BasicBlock ×[2, 2, 2, 2]; three downsampling blocks are diamonds (conv branch ∥ 1×1 conv);
* ``VGG16`` and ``AlexNet``: chains (one task after contraction, as in Table II);
* ``DenseNet121``: dense blocks of 6/12/24/16 layers, each layer reading the concatenation of every earlier
  one (a chain of concatenations to ``torch.fx``);
* ``GPT2``: 12 decoder blocks of 768 wide, 12 heads, 128 tokens; the query, key and value projections are
  three modules, so each block's attention is a multi-branch block (q ∥ k ∥ v, joined by attention), and
  the residual adds skip it. Logits are for the last token (the next one to generate).

``PAPER_MODELS`` maps each class name to (model factory, example input factory).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


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
    """torchvision's ResNet18 layout (He et al., 2016), 1000 classes: ``torch.fx`` traces it to 71 nodes."""

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


def vgg16() -> nn.Module:
    """torchvision's VGG16 (configuration D, Simonyan & Zisserman 2015) without batch norm."""
    layers: list[nn.Module] = []
    cin = 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, int(v), 3, padding=1), nn.ReLU(inplace=True)]
            cin = int(v)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(),
                         nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(),
                         nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(4096, 1000))


def alexnet() -> nn.Module:
    """torchvision's AlexNet (Krizhevsky et al., 2012, the one-tower variant)."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d(6), nn.Flatten(), nn.Dropout(), nn.Linear(256 * 36, 4096), nn.ReLU(inplace=True),
        nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, 1000))


class _DenseLayer(nn.Module):
    """BN-ReLU-1×1 conv (4·growth) - BN-ReLU-3×3 conv (growth) over the concatenation of earlier features."""

    def __init__(self, cin: int, growth: int = 32):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))


class _DenseBlock(nn.Module):
    def __init__(self, layers: int, cin: int, growth: int = 32):
        super().__init__()
        self.layers = nn.ModuleList(_DenseLayer(cin + i * growth, growth) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet121(nn.Module):
    """torchvision's DenseNet121 (Huang et al., 2017): blocks of 6, 12, 24, 16 layers, growth 32."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        parts: list[nn.Module] = []
        c = 64
        for i, n in enumerate((6, 12, 24, 16)):
            parts.append(_DenseBlock(n, c))
            c += 32 * n
            if i < 3:
                parts.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                                           nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)))
                c //= 2
        self.blocks = nn.Sequential(*parts)
        self.norm = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class _Attention(nn.Module):
    """Causal self-attention with separate q, k, v projections: three parallel branches joined by attention."""

    def __init__(self, width: int, heads: int, tokens: int):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.proj = nn.Linear(width, width)
        self.shape = (1, tokens, heads, width // heads)
        self.width, self.tokens = width, tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(self.shape).transpose(1, 2)
        k = self.k(x).view(self.shape).transpose(1, 2)
        v = self.v(x).view(self.shape).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(1, self.tokens, self.width))


class _GptBlock(nn.Module):
    def __init__(self, width: int, heads: int, tokens: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(width), _Attention(width, heads, tokens)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 small: 12 blocks, width 768, 12 heads, vocabulary 50257, over ``tokens`` tokens (batch 1)."""

    def __init__(self, tokens: int = 128, width: int = 768, blocks: int = 12, heads: int = 12, vocab: int = 50257):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Parameter(torch.zeros(1, tokens, width))
        self.h = nn.Sequential(*(_GptBlock(width, heads, tokens) for _ in range(blocks)))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.ln_f(self.h(self.wte(idx) + self.wpe))
        return self.lm_head(x[:, -1])


def _image() -> torch.Tensor:
    return torch.randn(1, 3, 224, 224)


def _tokens() -> torch.Tensor:
    return torch.randint(0, 50257, (1, 128))


PAPER_MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "gpt2": (GPT2, _tokens),
    "densenet121": (DenseNet121, _image),
    "vgg16": (vgg16, _image),
    "alexnet": (alexnet, _image),
    "resnet18": (ResNet18, _image),
}
"""Class name → (model factory, example input factory): the §IV-A classes, one image or 128 tokens a query."""
