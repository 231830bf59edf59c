"""Ray backend of the serving runtime: one actor per plan node, for plans that span several machines.

Each actor hosts a :class:`~tasks.serving.worker.ServingWorker` on its node (the models travel to it as
state dicts; the lease is taken by the driver on the pool's ledger, whose ``Placement.node`` names the Ray
node, and the actor is pinned there with ``NodeAffinitySchedulingStrategy``, the way ``tasks.ray_runner``
places tasks). The local :class:`~tasks.serving.frontend.Frontend` routes to :class:`RayWorkerHandle`
objects, which forward each routed burst (ids, stamps, input rows) with ``actor.push.remote``; each
forward is a Ray call (hundreds of µs), so this backend is for capacity across machines, not for the µs dispatch path of the local runtime.
Outcomes are pulled back with :meth:`RayWorkerHandle.collect`. Lightly exercised (Ray start-up is slow);
the local runtime carries the tests.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from gpu.batching import BatchPolicy
from gpu.ledger import Placement
from gpu.schedulers.nexus import GpuNode
from gpu.schedulers.nexus_profiles import BatchProfile


class _WorkerActor:
    """The actor body: builds the models from state dicts and runs a ServingWorker in the actor's process."""

    def __init__(self, node: GpuNode, states: Mapping[str, dict], profiles: Mapping[str, BatchProfile],
                 policy: BatchPolicy, device: str, threads: int = 1):
        from tasks.serving.models import ARCHITECTURES
        from tasks.serving.stats import Recorder
        from tasks.serving.worker import ServingWorker

        torch.set_num_threads(threads)
        models = {}
        for name, state in states.items():
            models[name] = ARCHITECTURES[name]()
            models[name].load_state_dict(state)
        self.recorder = Recorder()
        self.worker = ServingWorker(node, models, profiles, policy, self.recorder, device).start()

    def ready(self) -> bool:
        return True

    def push(self, session_id: str, ids: np.ndarray | int, arrival_ns: int, deadline_ns: int, xs: np.ndarray) -> None:
        self.worker.push(session_id, ids, arrival_ns, deadline_ns, xs)

    def update(self, node: GpuNode) -> None:
        self.worker.update(node)

    def collect(self) -> list:
        return self.recorder.take()

    def stop(self) -> list:
        self.worker.stop(drain=True)
        return self.collect()


class RayWorkerHandle:
    """What the frontend routes to: forwards each request to the node's actor."""

    def __init__(self, node: GpuNode, models: Mapping[str, torch.nn.Module], profiles: Mapping[str, BatchProfile],
                 policy: BatchPolicy, lease: Placement, device: str = "cpu", ray_node_id: str | None = None):
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
        self.lease = lease
        self.actor = ray.remote(_WorkerActor).options(**options).remote(node, states, dict(profiles), policy, device)
        # wait for the actor (a fresh process importing torch takes seconds): requests routed before it is up
        # would sit in Ray's queue past their deadlines and all be dropped
        ray.get(self.actor.ready.remote())

    def push(self, session_id: str, ids: np.ndarray | int, arrival_ns: int, deadline_ns: int, xs: np.ndarray) -> None:
        self.actor.push.remote(session_id, ids, arrival_ns, deadline_ns, xs)

    def update(self, node: GpuNode) -> None:
        self.actor.update.remote(node)

    def collect(self) -> list:
        import ray

        return ray.get(self.actor.collect.remote())

    def stop(self) -> list:
        import ray

        out = ray.get(self.actor.stop.remote())
        ray.kill(self.actor)
        return out
