"""The yardstick kernel: a fixed number of square matrix products, timed after a synchronise.

Compute-bound at the sizes used (8192² in bf16: ~1.1 TFLOP a product), so its rate follows the share of the
device's SMs a process may use (what MPS's active-thread percentage limits), and in fp32 it is the measured
ceiling a small model's throughput is put against. Work is a number of products, never a duration.

``python -m benchmarks.gpu_check.kernels [--size N] [--iterations K] [--dtype bfloat16]`` prints
``{"tflops": ..., "seconds": ...}``: the MPS check runs it in processes started with an MPS environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def matmul_rate(device: str, size: int = 8192, iterations: int = 20, dtype: str = "bfloat16") -> tuple[float, float]:
    """(TFLOP/s, seconds) of ``iterations`` ``size`` x ``size`` products on ``device``, after two untimed ones."""
    import torch

    kind = getattr(torch, dtype)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda _: None)  # a simulated pool's "cpu"
    a = torch.randn(size, size, device=device, dtype=kind)
    b = torch.randn(size, size, device=device, dtype=kind)
    for _ in range(2):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(iterations):
        a @ b
    sync(device)
    seconds = time.perf_counter() - start
    return 2.0 * size**3 * iterations / seconds / 1e12, seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    tflops, seconds = matmul_rate("cuda", args.size, args.iterations, args.dtype)
    print(json.dumps({"tflops": tflops, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
