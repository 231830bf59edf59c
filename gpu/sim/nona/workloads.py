"""The query classes of Nona's evaluation (§IV-A, Table II), generated from the models' layer shapes.

The paper profiles GPT2, DenseNet121, VGG16, AlexNet and ResNet18 with PipeDream and publishes neither the
per-layer times nor the transfer sizes. We rebuild the operator graphs from the architectures instead:
``resnet18_graph`` is the 71-node graph ``torch.fx`` traces from torchvision's ResNet18 (placeholder and
output included), with ``p`` = FLOPs of each operator and ``b`` = bytes of the float32 activation on each
edge, for one 224×224 image. The sequential models are chains (they contract to one task, Table II). GPT2 is
12 decoder blocks of 128 tokens, each with its q, k, v projections in parallel joining at the attention
(our own graph; Table II's 178 PipeDream nodes are not published). ``motivating_query`` is §II's
f(A, B) = det(A+B) + det(r(A+B)) with Fig. 1's times in ms (our choice, the paper gives totals only: 100 MB on det's edges, 10 MB on the sparse
det's), ops in ms of compute at ν = 1000 ops/s.
"""

from __future__ import annotations

from gpu.schedulers.nona.dag import Dag

F32 = 4  # bytes per activation value


def _conv(cin: int, cout: int, k: int, hw: int) -> float:
    """FLOPs of a k×k convolution producing cout×hw×hw (2 per multiply-add)."""
    return 2.0 * cin * cout * k * k * hw * hw


def resnet18_graph() -> Dag:
    """torchvision ResNet18 as torch.fx traces it: 71 nodes (Table II), FLOPs and activation bytes."""
    ops: dict[str, float] = {}
    edges: dict[tuple[str, str], float] = {}
    size: dict[str, float] = {}

    def node(name: str, flops: float, out_values: float, *inputs: str) -> str:
        ops[name], size[name] = flops, out_values * F32
        for i in inputs:
            edges[(i, name)] = size[i]
        return name

    x = node("x", 0.0, 3 * 224 * 224)
    x = node("conv1", _conv(3, 64, 7, 112), 64 * 112 * 112, x)
    x = node("bn1", 2 * 64 * 112 * 112, 64 * 112 * 112, x)
    x = node("relu", 64 * 112 * 112, 64 * 112 * 112, x)
    x = node("maxpool", 9 * 64 * 56 * 56, 64 * 56 * 56, x)
    cin, hw = 64, 56
    for layer, cout in zip((1, 2, 3, 4), (64, 128, 256, 512)):
        for block in (0, 1):
            stride = 2 if layer > 1 and block == 0 else 1
            out_hw, values = hw // stride, cout * (hw // stride) ** 2
            p = f"layer{layer}.{block}."
            y = node(p + "conv1", _conv(cin, cout, 3, out_hw), values, x)
            y = node(p + "bn1", 2 * values, values, y)
            y = node(p + "relu", values, values, y)
            y = node(p + "conv2", _conv(cout, cout, 3, out_hw), values, y)
            y = node(p + "bn2", 2 * values, values, y)
            skip = x
            if stride == 2:
                skip = node(p + "downsample.0", _conv(cin, cout, 1, out_hw), values, x)
                skip = node(p + "downsample.1", 2 * values, values, skip)
            y = node(p + "add", values, values, y, skip)
            x = node(p + "relu_1", values, values, y)
            cin, hw = cout, out_hw
    x = node("avgpool", 512 * 7 * 7, 512, x)
    x = node("flatten", 0.0, 512, x)
    x = node("fc", 2 * 512 * 1000, 1000, x)
    node("output", 0.0, 1000, x)
    return Dag.build("resnet18", ops, edges)


def chain(name: str, layers: int, total_flops: float, activation_bytes: float) -> Dag:
    """A sequential model (VGG16, AlexNet, DenseNet as our contraction sees it): ``layers`` equal operators."""
    ops = {f"{name}.{i}": total_flops / layers for i in range(layers)}
    names = list(ops)
    return Dag.build(name, ops, {(a, b): activation_bytes for a, b in zip(names, names[1:])})


def gpt2_graph(blocks: int = 12, tokens: int = 128, hidden: int = 768) -> Dag:
    """GPT2-small's decoder: per block, q, k, v in parallel → attention (+ projection) → residual add → MLP."""
    act = float(tokens * hidden * F32)
    proj = 2.0 * tokens * hidden * hidden
    attention = 2.0 * 2 * tokens * tokens * hidden + proj
    mlp = 2.0 * 2 * tokens * hidden * 4 * hidden
    ops: dict[str, float] = {"embed": 2.0 * tokens * hidden}
    edges: dict[tuple[str, str], float] = {}
    x = "embed"
    for b in range(blocks):
        heads = [f"h{b}.{n}" for n in "qkv"]
        ops.update({h: proj for h in heads})
        ops[f"h{b}.attn"] = attention
        ops[f"h{b}.add"] = act / F32
        ops[f"h{b}.mlp"] = mlp
        for h in heads:
            edges[(x, h)] = act
            edges[(h, f"h{b}.attn")] = act
        edges[(f"h{b}.attn", f"h{b}.add")] = act
        edges[(x, f"h{b}.add")] = act
        edges[(f"h{b}.add", f"h{b}.mlp")] = act
        x = f"h{b}.mlp"
    ops["lm_head"] = 2.0 * hidden * 50257  # the last token's logits
    edges[(x, "lm_head")] = act
    return Dag.build("gpt2", ops, edges)


def motivating_query() -> Dag:
    """§II, Fig. 1: ``sum`` (A+B, 1 ms) → ``det`` (10 ms, 100 MB edges) ∥ ``det_sparse`` (10 ms, 10 MB) → ``add``."""
    mb = 1e6
    return Dag.build("f", {"sum": 1.0, "det": 10.0, "det_sparse": 10.0, "add": 1.0},
                     {("sum", "det"): 100 * mb, ("det", "add"): 100 * mb,
                      ("sum", "det_sparse"): 10 * mb, ("det_sparse", "add"): 10 * mb})


def paper_models() -> dict[str, Dag]:
    """The five inference classes of §IV-A, uncontracted, in FLOPs and bytes (per image / per 128 tokens)."""
    return {
        "gpt2": gpt2_graph(),
        "densenet121": chain("densenet121", 8, 5.7e9, 4 * 256 * 28 * 28),
        "vgg16": chain("vgg16", 16, 31e9, 4 * 512 * 28 * 28),
        "alexnet": chain("alexnet", 8, 1.4e9, 4 * 192 * 13 * 13),
        "resnet18": resnet18_graph(),
    }
