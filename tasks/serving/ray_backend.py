"""Ray backend of the serving runtime: one actor per plan node, for plans that span several machines.

``LocalServingRuntime(..., backend="ray")`` takes each node's lease on the pool's ledger as for local
workers, then starts a :class:`RayWorkerHandle`: an actor hosting a
:class:`~tasks.serving.worker.ServingWorker` in its own process (the models travel to it as state dicts;
``ray_node_id`` pins it to the Ray node the lease names, the way ``tasks.runtime.ray_runner`` places tasks). The
local :class:`~tasks.serving.frontend.Frontend` routes to the handles as to local workers; each routed burst
(ids, stamps, input rows) is one ``actor.push.remote`` — a Ray call of hundreds of µs, so this backend buys
capacity across machines, not the µs dispatch path of local workers.

Clocks: stamps are ``perf_counter_ns`` (``CLOCK_MONOTONIC``), one clock per machine. An actor on the
frontend's own Ray node shares it (offset 0, exactly); for one on another node the handle measures the
actor's clock against its own as NTP does — the midpoint of the fastest of several round trips, error ≤ half
that trip (one slow, lopsided trip had put the offset ~1 ms off, and measured latencies below zero) — and
shifts arrival/deadline stamps into the actor's clock on the way out and finish/arrival/deadline back on the
way in, so deadlines are judged on the machine that runs the batch and latencies on the frontend's clock.
Outcomes come back as the worker recorder's raw chunks (``collect`` while serving, all of them on ``stop``).

Applications and measured feedback work as locally: a routed burst carries its application's ring code (the actor's
worker knows the names, ``apps``), the actor's worker keeps its batches' measurements (``measure_batches``) for
``take_batches``, and ``update_policy`` changes its policy in place between two batches (ORLOJ's re-profiled
histograms every epoch, ``tasks.serving.epochs``).

Queries as DAGs (``chains``): each actor runs its own :class:`~tasks.serving.chaining.QueryChainer` as its
worker's ``on_done`` hook, so a finished stage request issues the next stage's where it finished, as the local
backend does: to its own worker directly, to another node's actor with one ``push.remote`` (stamps moved into
that actor's clock: the difference of the two actors' offsets to the frontend). The runtime gives every actor
the plan's routing table and the other actors' handles (``set_routes``) at each re-plan; each actor issues ids
from its own range (``CHAINED_IDS`` + (node + 1)·2³⁶). The parent links and per-session counts of what an actor
issued come back with its outcomes and go to the runtime's chainer (``root``) and frontend (the planner's
measured rates).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import numpy as np
import torch

from gpu.batching import BatchPolicy
from gpu.ledger import Lease
from gpu.schedulers.nexus.squishy import GpuNode, Plan
from gpu.schedulers.nexus.controller import NexusController
from gpu.schedulers.nexus.profiles import Accounting, BatchProfile
from tasks.serving.chaining import QueryChainer
from tasks.serving.frontend import CHAINED_IDS, Frontend
from tasks.serving.models import ARCHITECTURES, INPUT_FEATURES
from tasks.serving.ring import check_width
from tasks.serving.stats import Recorder
from tasks.serving.worker import ServingWorker

COUNTERS = ("busy_ns", "execute_ns", "execute1_ns", "batches", "batches1", "served", "inline_batches",
            "inline_execute_ns")
# the actor's wall time in ``push``: the ring writes and the batches run inline there, which a local worker's
# frontend times in ``route_ns``
PUSH_NS = "push_ns"


class _Peer:
    """A node's actor as a push target, on that actor's clock (``offset``: its clock − the pusher's)."""

    __slots__ = ("actor", "offset")

    def __init__(self, actor: Any, offset: int):
        self.actor, self.offset = actor, offset

    def push(self, session_id: str, ids: np.ndarray | int, arrival_ns: Any, deadline_ns: Any, xs: np.ndarray,
             app: int = 0) -> None:
        self.actor.push.remote(session_id, ids, arrival_ns + self.offset, deadline_ns + self.offset, xs, app)


class _WorkerActor:
    """The actor body: builds the models from state dicts and runs a ServingWorker in the actor's process."""

    def __init__(self, node: GpuNode, states: Mapping[str, dict], profiles: Mapping[str, BatchProfile],
                 policy: BatchPolicy, device: str, accounting: Accounting, threads: int = 1,
                 chains: Mapping[str, tuple[str, float]] | None = None, load_balancer: str = "drr", seed: int = 0,
                 apps: tuple[str, ...] = (), measure_batches: bool = False):
        torch.set_num_threads(threads)
        models = {}
        for name, state in states.items():
            models[name] = ARCHITECTURES[name]()
            models[name].load_state_dict(state)
        self.recorder = Recorder()
        # routes what this node's query stages issue; its ids apart from the frontend's and every other node's
        self.controller = NexusController(chains=chains, load_balancer=load_balancer, rng=seed + node.node_id,
                                          time_unit="ns")
        self.frontend = Frontend(self.recorder, chained_ids=CHAINED_IDS + ((node.node_id + 1) << 36),
                                 router=self.controller.router)
        self.chainer = QueryChainer(self.controller, self.frontend)
        self.worker = ServingWorker(node, models, profiles, policy, self.recorder, device, accounting,
                                    on_done=self.chainer.parent_done, parents=self.chainer.parents, apps=apps,
                                    measure_batches=measure_batches).start()
        self.push_ns = 0

    def clock(self) -> int:
        return time.perf_counter_ns()

    def ray_node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def push(self, session_id: str, ids: np.ndarray | int, arrival_ns: Any, deadline_ns: Any,
             xs: np.ndarray, app: int = 0) -> None:
        t0 = time.perf_counter_ns()
        self.worker.push(session_id, ids, arrival_ns, deadline_ns, xs, app)
        self.push_ns += time.perf_counter_ns() - t0

    def push_many(self, pushes: list[tuple]) -> None:
        """The pushes of one frontend turn (``RayWorkerHandle.flush``), in order."""
        t0 = time.perf_counter_ns()
        for p in pushes:
            self.worker.push(*p)
        self.push_ns += time.perf_counter_ns() - t0

    def update(self, node: GpuNode) -> None:
        self.worker.update(node)

    def take_batches(self) -> list[tuple[str, int, int]]:
        return self.worker.take_batches()

    def update_policy(self, change: Any) -> None:
        self.worker.update_policy(change)

    def set_routes(self, plan: Plan, peers: Mapping[int, tuple[Any, int]], offset: int) -> None:
        """Where this node's query stages send what they issue: the plan's routing table over ``peers`` (node
        id → (actor, its clock offset to the frontend)); ``offset``: this actor's."""
        me = self.worker.node_id
        self.frontend.set_plan(plan, {nid: self.worker if nid == me else _Peer(actor, off - offset)
                                      for nid, (actor, off) in peers.items()})
        self.controller.install(plan)

    def collect(self) -> tuple[list[tuple], dict[int, int], dict[str, int]]:
        """The outcomes, parent links and per-session counts of issued requests since the last call."""
        links = self.chainer.parent_of
        taken = dict(links)  # one C-level copy: links the worker thread adds meanwhile stay for the next call
        for k in taken:
            del links[k]
        return self.recorder.take_chunks(), taken, self.frontend.take_counts()

    def stop(self, drain: bool) -> tuple[tuple[list[tuple], dict[int, int], dict[str, int]], dict[str, int],
                                         list[tuple[str, int, int]]]:
        try:
            self.worker.stop(drain=drain)
        finally:
            counters = {k: getattr(self.worker, k) for k in COUNTERS}
            counters[PUSH_NS] = self.push_ns
        return self.collect(), counters, self.worker.take_batches()


def _shift(chunks: list[tuple], offset: int) -> list[tuple]:
    """Recorder chunks with their stamps moved by ``offset`` ns (arrival, deadline, finish)."""
    return [(sid, node, ids, arr + offset, dl + offset, None if fin is None else fin + offset, batch, preds)
            for sid, node, ids, arr, dl, fin, batch, preds in chunks]


class RayWorkerHandle:
    """What the frontend routes to and the runtime manages: the worker API, forwarded to the node's actor.

    Counters (``busy_ns``, ``execute_ns``, …) are the actor's, read back when it stops (0 until then).
    """

    def __init__(self, node: GpuNode, models: Mapping[str, torch.nn.Module], profiles: Mapping[str, BatchProfile],
                 policy: BatchPolicy, lease: Lease, recorder: Recorder, accounting: Accounting,
                 device: str = "cpu", ray_node_id: str | None = None, chainer: QueryChainer | None = None,
                 seed: int = 0, apps: tuple[str, ...] = (), measure_batches: bool = False):
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
        self.chainer = chainer
        for k in (*COUNTERS, PUSH_NS):
            setattr(self, k, 0)
        self.actor = ray.remote(_WorkerActor).options(**options).remote(
            node, states, dict(profiles), policy, device, accounting, 1, chainer.controller.chains.chains if chainer else None,
            chainer.controller.router.kind if chainer else "drr", seed, tuple(apps), measure_batches)
        # wait for the actor (a fresh process importing torch takes seconds): requests routed before it is up
        # would sit in Ray's queue past their deadlines and all be dropped
        same_machine = ray.get(self.actor.ray_node.remote()) == ray.get_runtime_context().get_node_id()
        self.offset = 0 if same_machine else self._clock_offset()  # actor clock − frontend clock
        self._peer = _Peer(self.actor, self.offset)
        self._held: list[tuple] | None = None
        self._last_batches: list[tuple[str, int, int]] | None = None  # measured until the actor stopped

    def push(self, session_id: str, ids: np.ndarray | int, arrival_ns: Any, deadline_ns: Any, xs: np.ndarray,
             app: int = 0) -> None:
        """One Ray call per routed burst, or, inside a frontend turn (``hold``), one per turn (``flush``)."""
        check_width(xs, INPUT_FEATURES)
        if self._held is None:
            self._peer.push(session_id, ids, arrival_ns, deadline_ns, xs, app)
        else:
            self._held.append((session_id, ids, arrival_ns + self.offset, deadline_ns + self.offset, xs, app))

    def hold(self) -> None:
        self._held = []

    def flush(self) -> None:
        held, self._held = self._held, None
        if held:
            self.actor.push_many.remote(held)

    def _clock_offset(self, trips: int = 7) -> int:
        """The actor's clock minus ours, from the round trip with the least time for asymmetry to hide in."""
        import ray

        best = None
        for _ in range(trips):
            t0 = time.perf_counter_ns()
            remote = ray.get(self.actor.clock.remote())
            t1 = time.perf_counter_ns()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, remote - (t0 + t1) // 2)
        return best[1]

    def update(self, node: GpuNode) -> None:
        self.actor.update.remote(node)

    def take_batches(self) -> list[tuple[str, int, int]]:
        """``(session, batch size, forward ns)`` of the batches the actor's worker ran since the last call."""
        import ray

        if self._last_batches is not None:
            out, self._last_batches = self._last_batches, []
            return out
        return ray.get(self.actor.take_batches.remote())

    def update_policy(self, change: Callable[[BatchPolicy], None]) -> None:
        """Apply ``change`` to the actor's policy between two of its batches (it travels pickled)."""
        import ray

        ray.get(self.actor.update_policy.remote(change))

    def set_routes(self, plan: Plan, peers: Mapping[int, "RayWorkerHandle"]) -> None:
        """Tell the actor where its query stages' requests go (the plan's nodes' actors)."""
        self.actor.set_routes.remote(plan, {nid: (h.actor, h.offset) for nid, h in peers.items()}, self.offset)

    def collect(self) -> None:
        """Pull the outcomes recorded so far into the runtime's recorder (and what the actor's query stages
        issued into its chainer and frontend)."""
        import ray

        self._merge(*ray.get(self.actor.collect.remote()))

    def _merge(self, chunks: list[tuple], links: dict[int, int], counts: dict[str, int]) -> None:
        self.recorder.extend(_shift(chunks, -self.offset))
        if self.chainer is not None:
            self.chainer.parent_of.update(links)
            self.chainer.frontend.add_chained(counts)

    def stop(self, drain: bool = True) -> None:
        """Stop the actor's worker (serving or dropping its queue), pull every outcome and counter, end it."""
        import ray

        try:
            collected, counters, self._last_batches = ray.get(self.actor.stop.remote(drain))
            self._merge(*collected)
            for k, v in counters.items():
                setattr(self, k, v)
        finally:
            ray.kill(self.actor)
