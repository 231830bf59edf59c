"""Synthetic linear batching profiles for the paper's models, built from the paper's anchors (inferred).

Nexus (Shen et al., SOSP'19) names its evaluation models but publishes no batching profiles for them; the
only profiles we have (``gpu/data/nexus``) are TITAN X VGG/YOLO tables whose throughput is already flat by
batch ≈ 10, so batching — and hence batch-aware scheduling — matters little on them. Spec §7 item 5 says to
build synthetic ``ℓ(b) = αb + β`` profiles from the paper's anchors instead:

* batch-1 latency ``ℓ(1)``: Table 1 (LeNet5 < 0.1 ms, VGG7 < 1 ms, ResNet-50 6.2 ms, Inception-v4 7.0 ms,
  Darknet-53 26.3 ms), §7.3.2 (SSD 47 ms, GoogleNet-car 4.2 ms);
* batching gain ``g = throughput(32) / throughput(1)``: §2.2 "4.7-13.3×" at batch 32 (VGG, ResNet,
  Inception). We take the middle, 8×, for the classifiers, the low end 4.7× for the large detectors
  (SSD, Darknet-53) and the high end 13.3× for the tiny models (LeNet, VGG7) (inferred).

From the two anchors ``ℓ(32) = 32·ℓ(1)/g``, so ``α = (ℓ(32) − ℓ(1))/31`` and ``β = ℓ(1) − α``. Memory (for the
merge check and prefix batching) is the model's footprint at its max batch, an order-of-magnitude guess
(inferred): ResNet-50 ≈ 1 GiB of weights plus activations; one fully-connected suffix layer ≈ 8 MiB.

Example: ``synthetic_profile("resnet50")`` → ℓ(1) = 6.2 ms, ℓ(32) = 24.8 ms (α = 0.6, β = 5.6 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu.errors import ConfigError
from gpu.schedulers.nexus.profiles import BatchProfile, linear_profile

MIB = 1024**2


@dataclass(frozen=True)
class Anchor:
    """Paper anchor of one model: batch-1 latency (ms), batch-32 throughput gain, memory (bytes)."""

    latency1_ms: float
    gain32: float
    memory_bytes: int

    @property
    def alpha_ms(self) -> float:
        return self.latency1_ms * (32.0 / self.gain32 - 1.0) / 31.0

    @property
    def beta_ms(self) -> float:
        return self.latency1_ms - self.alpha_ms


ANCHORS: dict[str, Anchor] = {
    "lenet": Anchor(0.1, 13.3, 64 * MIB),
    "vgg7": Anchor(1.0, 13.3, 256 * MIB),
    "googlenet": Anchor(4.2, 8.0, 512 * MIB),
    "resnet50": Anchor(6.2, 8.0, 1024 * MIB),
    "inception": Anchor(7.0, 8.0, 1024 * MIB),
    "darknet53": Anchor(26.3, 4.7, 1536 * MIB),
    "ssd": Anchor(47.0, 4.7, 1536 * MIB),
}
SUFFIX_FC_MEMORY_BYTES = 8 * MIB  # one 2048×1000 fp32 FC layer + its activations (inferred)


def synthetic_profile(model: str, max_batch: int = 128, name: str | None = None) -> BatchProfile:
    """The linear profile of one anchored model (``name`` renames it, e.g. for specialised variants)."""
    if model not in ANCHORS:
        raise ConfigError("model", model, f"no paper anchor; choose one of {sorted(ANCHORS)}")
    a = ANCHORS[model]
    return linear_profile(name or model, a.alpha_ms, a.beta_ms, max_batch, a.memory_bytes)


def synthetic_profiles(max_batch: int = 128) -> dict[str, BatchProfile]:
    """Every anchored model's profile by name."""
    return {m: synthetic_profile(m, max_batch) for m in ANCHORS}
