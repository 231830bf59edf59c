"""Ray backend of the serving runtime: one actor per plan node, for plans that span several machines.

``LocalServingRuntime(..., backend="ray")`` takes each node's lease on the pool's ledger as for local
workers, then starts a :class:`RayWorkerHandle`: an actor hosting a
:class:`~tasks.serving.worker.ServingWorker` in its own process (the models travel to it as state dicts;
``ray_node_id`` pins it to the Ray node the lease names, the way ``tasks.ray_runner`` places tasks). The
local :class:`~tasks.serving.frontend.Frontend` routes to the handles as to local workers; each routed burst
(ids, stamps, input rows) is one ``actor.push.remote`` — a Ray call of hundreds of µs, so this backend buys
capacity across machines, not the µs dispatch path of local workers.

Clocks: stamps are ``perf_counter_ns``, which is per machine. At start the handle measures the actor's clock
against its own (the midpoint of one round trip, as NTP does; error ≤ half the round trip) and shifts
arrival/deadline stamps into the actor's clock on the way out and finish/arrival/deadline back on the way
in, so deadlines are judged on the machine that runs the batch and latencies on the frontend's clock.
Outcomes come back as the worker recorder's raw chunks (``collect`` while serving, all of them on ``stop``).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np
import torch

from gpu.batching import BatchPolicy
from gpu.ledger import Placement
from gpu.schedulers.nexus import GpuNode
from gpu.schedulers.nexus_profiles import Accounting, BatchProfile
from tasks.serving.stats import Recorder

COUNTERS = ("busy_ns", "execute_ns", "execute1_ns", "batches", "batches1", "served", "inline_batches",
            "inline_execute_ns")


class _WorkerActor:
    """The actor body: builds the models from state dicts and runs a ServingWorker in the actor's process."""

    def __init__(self, node: GpuNode, states: Mapping[str, dict], profiles: Mapping[str, BatchProfile],
                 policy: BatchPolicy, device: str, accounting: Accounting, threads: int = 1):
        from tasks.serving.models import ARCHITECTURES
        from tasks.serving.worker import ServingWorker

        torch.set_num_threads(threads)
        models = {}
        for name, state in states.items():
            models[name] = ARCHITECTURES[name]()
            models[name].load_state_dict(state)
        self.recorder = Recorder()
        self.worker = ServingWorker(node, models, profiles, policy, self.recorder, device, accounting).start()

    def clock(self) -> int:
        return time.perf_counter_ns()

    def push(self, session_id: str, ids: np.ndarray | int, arrival_ns: Any, deadline_ns: Any,
             xs: np.ndarray) -> None:
        self.worker.push(session_id, ids, arrival_ns, deadline_ns, xs)

    def update(self, node: GpuNode) -> None:
        self.worker.update(node)

    def collect(self) -> list[tuple]:
        return self.recorder.take_chunks()

    def stop(self, drain: bool) -> tuple[list[tuple], dict[str, int]]:
        try:
            self.worker.stop(drain=drain)
        finally:
            counters = {k: getattr(self.worker, k) for k in COUNTERS}
        return self.recorder.take_chunks(), counters


def _shift(chunks: list[tuple], offset: int) -> list[tuple]:
    """Recorder chunks with their stamps moved by ``offset`` ns (arrival, deadline, finish)."""
    return [(sid, node, ids, arr + offset, dl + offset, None if fin is None else fin + offset, batch, preds)
            for sid, node, ids, arr, dl, fin, batch, preds in chunks]


class RayWorkerHandle:
    """What the frontend routes to and the runtime manages: the worker API, forwarded to the node's actor.

    Counters (``busy_ns``, ``execute_ns``, …) are the actor's, read back when it stops (0 until then).
    """

    def __init__(self, node: GpuNode, models: Mapping[str, torch.nn.Module], profiles: Mapping[str, BatchProfile],
                 policy: BatchPolicy, lease: Placement, recorder: Recorder, accounting: Accounting,
                 device: str = "cpu", ray_node_id: str | None = None):
        import ray

        options: dict[str, Any] = {"num_cpus": 0, "num_gpus": 0}  # the ledger, not Ray, accounts GPU slices
        if ray_node_id:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(ray_node_id, soft=False)
        if lease.devices and not lease.simulated:
            options["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": lease.cuda_visible_devices}}
            device = "cuda:0"
        states = {name: {k: v.cpu() for k, v in m.state_dict().items()} for name, m in models.items()}
        self.node_id = node.node_id
        self.device = torch.device(device)
        self.recorder = recorder
        for k in COUNTERS:
            setattr(self, k, 0)
        self.actor = ray.remote(_WorkerActor).options(**options).remote(node, states, dict(profiles), policy, device,
                                                                         accounting)
        # wait for the actor (a fresh process importing torch takes seconds): requests routed before it is up
        # would sit in Ray's queue past their deadlines and all be dropped
        ray.get(self.actor.clock.remote())
        t0 = time.perf_counter_ns()  # the first call included the actor's start-up: measure on a warm one
        remote = ray.get(self.actor.clock.remote())
        t1 = time.perf_counter_ns()
        self.offset = remote - (t0 + t1) // 2  # actor clock − frontend clock

    def push(self, session_id: str, ids: np.ndarray | int, arrival_ns: Any, deadline_ns: Any, xs: np.ndarray) -> None:
        self.actor.push.remote(session_id, ids, arrival_ns + self.offset, deadline_ns + self.offset, xs)

    def update(self, node: GpuNode) -> None:
        self.actor.update.remote(node)

    def collect(self) -> None:
        """Pull the outcomes recorded so far into the runtime's recorder."""
        import ray

        self.recorder.extend(_shift(ray.get(self.actor.collect.remote()), -self.offset))

    def stop(self, drain: bool = True) -> None:
        """Stop the actor's worker (serving or dropping its queue), pull every outcome and counter, end it."""
        import ray

        try:
            chunks, counters = ray.get(self.actor.stop.remote(drain))
            self.recorder.extend(_shift(chunks, -self.offset))
            for k, v in counters.items():
                setattr(self, k, v)
        finally:
            ray.kill(self.actor)
