"""Check 6: ℓ(b) of real torch models on the device, as the Nexus and ORLOJ profiles use it (Nexus §6.1, Eq. 1).

The serving runtime's profiler (``tasks.serving.models.profile_model``: the authors' dry runs, timed runs and
trimmed mean) times two of its models at every batch size b = 1..64 on CUDA: ``digits_cnn`` (the steepest
per-input cost of the static models Nexus plans for) and ``digits_dynamic`` (early exits, ORLOJ's dynamic model).
From the profile: the batching gain (throughput at 64 over throughput at 1), the Eq. 1 fit ℓ(b) = αb + β, and
the throughput at b = 64 against the device's limit: the model's FLOPs per input (torch's ``FlopCounterMode``)
times its inputs per second, as a share of the yardstick's fp32 rate measured on the same device. Beside it, the
gain of the authors' published VGG-16 profile (TITAN X) at b = 64.
"""

from __future__ import annotations

from benchmarks.gpu_check.items import Settings
from benchmarks.gpu_check.kernels import matmul_rate
from benchmarks.gpu_check.report import Outcome, verdict

MODELS = ("digits_cnn", "digits_dynamic")
BATCH = 64
PAPER_MODEL = "vgg16"


def gain(latency_1: float, latency_b: float, b: int = BATCH) -> float:
    """Throughput at batch ``b`` over throughput at batch 1, from ℓ(1) and ℓ(b)."""
    return (b / latency_b) / (1 / latency_1)


def flops_per_input(model, device: str) -> float:
    """FLOPs of one input through ``model`` (a batch of ``BATCH`` counted by torch, divided by ``BATCH``)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.rand(BATCH, 64, device=device)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() / BATCH


def check(settings: Settings) -> Outcome:
    from gpu.schedulers.nexus.profiles import fit_linear, load_published_profile
    from tasks.serving.models import ARCHITECTURES, profile_model

    repeats = 5 if settings.quick else 10
    ceiling, _ = matmul_rate("cuda", 8192, 10, "float32")
    failures, parts, figures = [], [], {"fp32_tflops": ceiling}
    for name in MODELS:
        model = ARCHITECTURES[name]().to("cuda").eval()
        profile = profile_model(name, model, "cuda", batches=range(1, BATCH + 1), repeats=repeats)
        fit = fit_linear(profile)
        g = gain(profile.latency(1), profile.latency(BATCH))
        rate = BATCH / (profile.latency(BATCH) / 1e3)
        share = flops_per_input(model, "cuda") * rate / (ceiling * 1e12)
        if not g > 1:
            failures.append(f"{name}: batching gains nothing ({g:.2f}x at b={BATCH})")
        parts.append(f"{name} l(1)={profile.latency(1):.2f} l(64)={profile.latency(BATCH):.2f} ms, gain {g:.0f}x, "
                     f"{100 * share:.2g}% of fp32")
        figures |= {f"{name}_latency_ms": list(profile.latency_ms), f"{name}_gain": g, f"{name}_alpha_ms": fit.alpha_ms,
                    f"{name}_beta_ms": fit.beta_ms, f"{name}_r2": fit.r2, f"{name}_inputs_per_s": rate,
                    f"{name}_share_of_fp32": share}
    paper = load_published_profile(PAPER_MODEL)
    figures["paper_vgg16_gain"] = gain(paper.latency(1), paper.latency(BATCH))
    figure = "; ".join(parts) + f" ({ceiling:.0f} TFLOP/s); paper {PAPER_MODEL} {figures['paper_vgg16_gain']:.1f}x"
    return verdict("batching", failures, figure, figures)
