"""One prepared command that checks the whole GPU path on a CUDA machine: ``python -m benchmarks.gpu_check``.

Eight checks, one module each, every one through the project's own code (the runners, the Salus executor, the
flows' task functions), printed as PASS / FAIL / SKIP with what it measured:

1. ``devices``: NVML and torch agree on devices, memory and UUIDs; ``gpuflows devices`` lists them;
2. ``pool``: ``GpuTaskRunner`` (process mode) on real devices: shared slices, a memory cap, whole devices;
3. ``mps``: the MPS active-thread percentage, and a kernel's throughput, follow the slice;
4. ``salus``: two torch jobs in the executor's memory lanes, switch cost, memory, SRTF vs FIFO;
5. ``ekya`` and ``fluid``: one window and one TrialGroup on CUDA, measured time vs the profilers' predictions;
6. ``batching``: ℓ(b) of real models at b = 1..64 as the Nexus and ORLOJ profiles use it;
7. ``tracking``: NVML readings per task in MLflow (SKIP without mlflow).

``cli`` runs each in a process of its own under a time budget (``items``); ``report`` is the line and JSON format.
No module here imports mlflow or ray at module level: the GPU machine has neither.
"""
