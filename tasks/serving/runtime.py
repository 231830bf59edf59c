"""The local serving runtime: rolls a Nexus plan out onto the GPU pool as worker threads with leases.

Each plan node becomes one :class:`~tasks.serving.worker.ServingWorker` thread in this process that holds
a lease on the pool ledger for the node's duty share (``ResourceRequest(gpus=share)``, share = the node's
occupancy ℓ-time / duty cycle rounded up to 1/20, saturated nodes a whole GPU), and runs on the lease's
device. Why leases from the ledger and not one Prefect task per worker through ``GpuTaskRunner``: a
serving worker lives for the whole rollout and must receive each request in microseconds from the
frontend; as a task it would pin a task-runner slot for the rollout and (in process mode) put a
pickling IPC hop of tens of µs on every request — more than the whole dispatch budget (5 % of a small
model's batch-1 latency). The ledger is still the one owner of GPU slices, so leases are visible to and
respected by every other flow on the pool, and ``close()`` (also on error) releases them.

``apply(plan)`` is incremental, like Nexus's epoch update: nodes that keep their id keep their worker and
queues (sessions added or retired in place), removed nodes drain their queues and give their lease back,
new nodes get a lease and a worker; the frontend switches to the new routing table in between.
"""

from __future__ import annotations

import gc
import math
from typing import Any, Callable, Mapping

import torch
from torch import nn

from gpu.batching import BatchPolicy, SpanPolicy
from gpu.schedulers.nexus.batching import EarlyDropPolicy
from gpu.errors import AllocationTimeout, ConfigError, GpuflowsError
from gpu.ledger import LedgerClient, Lease
from gpu.placement import ResourceRequest
from gpu.scenario import choose
from gpu.schedulers.nexus.squishy import GpuNode, Plan
from gpu.schedulers.nexus.controller import NexusController
from gpu.schedulers.nexus.overflow import route_unassigned
from gpu.schedulers.nexus.profiles import PRESETS, BatchProfile
from gpu.schedulers.nexus.routing import QueryRouting
from tasks.serving.chaining import QueryChainer
from tasks.serving.frontend import Frontend
from tasks.serving.link import EmulatedLink
from tasks.serving.ray_backend import RayWorkerHandle
from tasks.serving.stats import Recorder
from tasks.serving.transport import SocketLink
from tasks.serving.worker import ServingWorker, check_policy

SHARE_STEP = 0.05
BACKENDS = ("local", "ray")
LINKS = ("socket", "emulated")
"""The bottleneck link between nodes: real bytes over a loopback socket paced at μ, or a computed delay."""


def lease_share(node: GpuNode) -> float:
    """GPU fraction a node leases: its occupancy rounded up to ``SHARE_STEP`` (a whole GPU when saturated)."""
    if node.saturated:
        return 1.0
    return min(1.0, max(SHARE_STEP, math.ceil(node.occupancy / SHARE_STEP - 1e-9) * SHARE_STEP))


def placement_device(placement: Lease) -> str:
    """Torch device of a lease: ``cuda:N`` on a real GPU (when torch sees CUDA), else ``cpu``."""
    if placement.simulated or not placement.devices or not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{placement.devices[0]}"


class LocalServingRuntime:
    """Workers as threads in this process, each holding a lease for its node on the pool ledger.

    Args:
        models: model name → trained torch module.
        profiles: model name → measured batching profile (the ones the plan was made from).
        ledger: the pool's ledger (``GpuPool(...).open_ledger()``).
        policy: a ``BatchPolicy`` shared by the workers (default early drop; the span policies are stateless).
        policy_factory: instead of ``policy``, makes one policy per worker (for policies with state: ORLOJ and
            its Clockwork-/Clipper-like baselines, ``gpu.systems.make_batch_policy``).
        preset: latency accounting of the plans (``paper``/``code``).
        load_balancer: ``drr`` or ``weighted_random``.
        allocation_timeout: seconds to wait for a lease before failing the rollout.
        cpu_threads: torch intra-op threads (workers on the CPU each use one core like one simulated GPU;
            None leaves torch's setting alone).
        gc_threshold: while the runtime is open, objects alive at start-up are frozen out of the cyclic
            garbage collector (``gc.freeze``) and the young-generation threshold is raised to this value;
            every request allocates a few objects, and the default threshold (700) made collections a
            measured ~80 % of the frontend's per-request time. None leaves the collector alone.
        run_inline: an idle worker's batch runs on the submitting thread (``ServingWorker``: run to
            completion, no thread wake-up); False keeps every batch on the workers' threads.
        backend: ``local`` (worker threads in this process) or ``ray`` (one Ray actor per node,
            ``tasks.serving.ray_backend``; Ray must be initialised, e.g. by ``GpuRayTaskRunner``, and the
            ledger should be the one Ray tasks place on). Leases, routing and re-planning are the same.
        chains: ``{child stage session: (parent stage session, γ)}`` — serve queries as DAGs: a finished stage
            request issues the next stage's (``tasks.serving.chaining``; with Ray, from the actor that ran it);
            feed load to the root stages only. ``chainer.root(id)`` is the first request of the query a request
            belongs to (with Ray, of the requests ``sync``/``take_counts``/``close`` brought back).
        controller: the Nexus controller that routes and chains (``gpu.schedulers.nexus.controller``, clock
            ``ns``; a flow's, whose ``on_epoch`` decides the plans ``apply`` rolls out). Default: one of this
            runtime's own from ``chains``, ``load_balancer`` and ``seed``; with a controller those two stay unset.
        apps: application id → its own SLO in ms (None: its session's), for ``frontend.submit(..., app=...)``;
            the workers hand each request's application to the policy (``Frontend``).
        query_routing: per-query routing of multi-stage queries (``Frontend``; e.g. Nona's
            ``gpu.schedulers.nona.controller.NonaRouting``); default: every request follows its session's shares.
        link_mu: a bottleneck link of this many bytes/s between nodes: cross-node hand-offs between query
            stages queue on it FIFO; None: hand-offs cost nothing.
        link: ``socket`` (the hand-offs' bytes cross a loopback TCP connection paced at ``link_mu``,
            ``tasks.serving.transport``) or ``emulated`` (a computed delay, no bytes move: ``tasks.serving.link``).
        handoff_bytes: bytes a hand-off to each child stage session carries per request (default: its input
            row's), e.g. the parent's measured activation size.
        measure_batches: workers keep every batch's size and forward time for ``take_batches``; ``"cpu"``: the
            forward's thread CPU time rather than its wall time (``ServingWorker``).
    """

    def __init__(self, models: Mapping[str, nn.Module], profiles: Mapping[str, BatchProfile], ledger: LedgerClient,
                 policy: BatchPolicy | None = None, preset: str = "paper",
                 load_balancer: str = "drr", seed: int = 0, allocation_timeout: float = 30.0,
                 cpu_threads: int | None = 1, label: str = "nexus",
                 policy_factory: Callable[[], BatchPolicy] | None = None, gc_threshold: int | None = 100_000,
                 run_inline: bool = True, backend: str = "local",
                 chains: Mapping[str, tuple[str, float]] | None = None, controller: NexusController | None = None,
                 apps: Mapping[str, float | None] | None = None, query_routing: QueryRouting | None = None,
                 link_mu: float | None = None, handoff_bytes: Mapping[str, float] | None = None,
                 measure_batches: bool | str = False, link: str = "socket"):
        if backend not in BACKENDS:
            raise ConfigError("backend", backend, f"unknown serving backend; choose one of {list(BACKENDS)}")
        if controller is not None and (chains or load_balancer != "drr"):
            raise ConfigError("controller", controller.policy, "routes and chains by itself: leave chains and "
                                                               "load_balancer unset")
        if controller is not None and controller.chains.time_unit != "ns":
            raise ConfigError("controller.time_unit", controller.chains.time_unit, "the runtime's clock is ns")
        self.measure_batches = measure_batches
        self.backend = backend
        self.models = dict(models)
        self.profiles = dict(profiles)
        self.ledger = ledger
        self._policy_factory = policy_factory
        self._policy = check_policy(policy_factory() if policy_factory else (policy or EarlyDropPolicy()))
        if apps and any(slo is not None for slo in apps.values()) and isinstance(self._policy, SpanPolicy):
            raise ConfigError("apps", dict(apps), f"per-application SLOs leave a queue out of deadline order, which "
                                                  f"the span policy {self._policy.name!r} relies on; use an object "
                                                  "policy such as orloj")
        self.accounting = choose(preset, "preset", PRESETS)
        self.recorder = Recorder()
        self.controller = controller or NexusController(chains=chains, load_balancer=load_balancer, rng=seed,
                                                        time_unit="ns")
        if (query_routing is not None or link_mu is not None) and backend != "local":
            raise ConfigError("backend", backend, "per-query routing and the link between nodes are local-backend only")
        kind = choose(link, "link", list(LINKS))
        self.link = (None if link_mu is None else
                     SocketLink(link_mu).start() if kind == "socket" else EmulatedLink(link_mu).start())
        self.frontend = Frontend(self.recorder, router=self.controller.router, apps=apps, query_routing=query_routing,
                                 link=self.link, handoff_bytes=handoff_bytes)
        self.chainer = QueryChainer(self.controller, self.frontend)
        self.seed = seed
        self.allocation_timeout = allocation_timeout
        self.label = label
        self.run_inline = run_inline
        self.workers: dict[int, ServingWorker] = {}
        self._retired_batches: list[list[tuple[str, int, int]]] = []
        self.leases: dict[int, Lease] = {}
        self.plan: Plan | None = None
        self._retired = {"busy_ns": 0, "execute_ns": 0, "execute1_ns": 0, "batches": 0,
                         "batches1": 0, "served": 0, "inline_batches": 0, "inline_execute_ns": 0, "push_ns": 0}
        if cpu_threads is not None:
            torch.set_num_threads(cpu_threads)
        self._gc_saved = None
        if gc_threshold is not None:
            self._gc_saved = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(gc_threshold, *self._gc_saved[1:])

    def _new_policy(self) -> BatchPolicy:
        return check_policy(self._policy_factory()) if self._policy_factory else self._policy

    def _lease(self, node: GpuNode, plan: Plan) -> Lease:
        share = lease_share(node)
        try:
            return self.ledger.allocate(ResourceRequest(gpus=share, label=f"{self.label}-node-{node.node_id}"),
                                        self.allocation_timeout)
        except AllocationTimeout as exc:
            total = sum(lease_share(n) for n in plan.nodes)
            raise AllocationTimeout(
                f"plan needs {plan.num_gpus} GPU node(s) (lease shares sum to {total:.2f}); node {node.node_id} "
                f"(gpus={share:g}) got no slice of the pool within {self.allocation_timeout}s"
                f"{self._holders()}") from exc

    def _holders(self) -> str:
        """Who holds the pool now, by lease label (a rollout's leases carry its run's name), for the timeout's
        message: two rollouts started side by side on one pool wait for each other's whole trace."""
        try:
            held = [lease.describe() for lease in self.ledger.leases() if lease.lease_id not in
                    {mine.lease_id for mine in self.leases.values()}]
        except (AttributeError, GpuflowsError):  # a ledger that cannot list its leases (Ray's client)
            return ""
        return ("; the pool is held by " + ", ".join(held) + " (deployments: the work queue `serving` runs "
                "rollouts one at a time)") if held else ""

    def apply(self, plan: Plan) -> None:
        """Roll ``plan`` out: lease and start new nodes, update kept ones, drain and release removed ones.

        A plan capped at the pool's size (``SquishyPacker.plan(max_gpus=...)``) may list load in
        ``Plan.unassigned``; it is routed onto the plan's nodes first — where it fits its SLO, else where it
        overbooks least (``route_unassigned``, as the simulator serves it) — so the batch policy serves or drops
        it; only load no GPU has memory for stays unrouted, and the frontend drops that.
        """
        plan = route_unassigned(plan, self.profiles, self.accounting)
        self.controller.install(plan)
        wanted = {n.node_id: n for n in plan.nodes}
        for nid, node in wanted.items():
            old = self.workers.get(nid)
            share = lease_share(node)
            if old is not None and math.isclose(self.leases[nid].fraction, share):
                old.update(node)
                continue
            lease = self._lease(node, plan)
            device = placement_device(lease)
            if old is not None and str(old.device) == str(torch.device(device)):
                self.ledger.release(self.leases[nid].lease_id)
                self.leases[nid] = lease
                old.update(node)
                continue
            if old is not None:  # moved to another device: drain the old worker there
                self._retire(nid)
            try:
                worker = self._start_worker(node, lease, device)
            except BaseException:  # e.g. a model this runtime does not have: the slice goes back at once
                self.ledger.release(lease.lease_id)
                raise
            self.leases[nid] = lease
            self.workers[nid] = worker
        self.frontend.set_plan(plan, self.workers)
        if self.backend == "ray" and self.chainer.parents:  # actors issue query stages: give them the routes,
            peers = {nid: self.workers[nid] for nid in wanted}  # the retiring ones too (they drain first)
            for w in self.workers.values():
                w.set_routes(plan, peers)
        for nid in [n for n in self.workers if n not in wanted]:
            self._retire(nid)
        self.plan = plan

    def _start_worker(self, node: GpuNode, lease: Lease, device: str) -> Any:
        if self.backend == "ray":
            return RayWorkerHandle(node, self.models, self.profiles, self._new_policy(), lease, self.recorder,
                                   self.accounting, device, chainer=self.chainer, seed=self.seed,
                                   apps=self.frontend.apps, measure_batches=self.measure_batches)
        return ServingWorker(node, self.models, self.profiles, self._new_policy(), self.recorder, device,
                             self.accounting, self.run_inline, self.chainer.parent_done, self.chainer.parents,
                             apps=self.frontend.apps, measure_batches=self.measure_batches).start()

    def sync(self) -> None:
        """Bring remote workers' outcomes so far into ``recorder`` (local workers record directly), with what
        their query stages issued."""
        for w in self.workers.values():
            if hasattr(w, "collect"):
                w.collect()

    def take_counts(self) -> dict[str, int]:
        """Arrivals per session since the last call, the requests query stages issued included (what the epoch
        planner observes every beacon; with Ray this pulls the actors' outcomes so far)."""
        self.sync()
        return self.frontend.take_counts()

    def take_batches(self) -> dict[str, list[tuple[int, float]]]:
        """Per application (per session for requests without one), ``(batch size, forward ms)`` of every batch
        the workers ran since the last call (workers built with ``measure_batches``; those retired since count
        too; a batch mixing applications is left out, ``ServingWorker``)."""
        out: dict[str, list[tuple[int, float]]] = {}
        for rows in [*self._retired_batches, *(w.take_batches() for w in self.workers.values()
                                                if hasattr(w, "take_batches"))]:
            for sid, k, ns in rows:
                out.setdefault(sid, []).append((k, ns / 1e6))
        self._retired_batches = []
        return out

    def update_policies(self, change: Callable[[BatchPolicy], None]) -> None:
        """Apply ``change`` to every running worker's policy, each between two of its batches (a Ray actor's in
        its process); workers started later get theirs from the policy factory."""
        for w in self.workers.values():
            w.update_policy(change)

    def _retire(self, nid: int, drain: bool = True) -> None:
        worker = self.workers.pop(nid)
        try:
            worker.stop(drain=drain)
            if hasattr(worker, "take_batches"):
                self._retired_batches.append(worker.take_batches())
            for k in self._retired:
                self._retired[k] += getattr(worker, k, 0)  # push_ns: remote workers only
        finally:
            self.ledger.release(self.leases.pop(nid).lease_id)

    @property
    def gpu_share(self) -> float:
        """GPU fraction currently leased from the pool."""
        return sum(p.fraction for p in self.leases.values())

    def counters(self) -> dict[str, int]:
        out = dict(self._retired)
        for w in self.workers.values():
            for k in out:
                out[k] += getattr(w, k, 0)  # push_ns: remote workers only
        return out

    def overhead(self) -> dict[str, float]:
        """The runtime's dispatch overhead per request (µs of wall time), best read after ``close()``.

        Overhead = time in the frontend's ``submit`` (stamp, route, enqueue, and the batches it ran for idle
        workers; with Ray, the calls to the actors and the actors' ``push`` handlers) plus the workers' busy time (policy decisions over the rings, batch slices, result hand-back,
        loop and wake-ups, issuing query stages' children), less every forward pass (wherever it ran), over the
        requests submitted and chained. Wall
        time: pre-emption by other processes and GIL hand-offs count against the runtime, not for it.
        ``inline_share``: the fraction of batches the frontend's thread ran itself.
        """
        c = self.counters()
        requests = self.frontend.submitted + self.frontend.chained
        n = max(1, requests)
        front_ns = self.frontend.route_ns + c["push_ns"] - c["inline_execute_ns"]
        worker_ns = c["busy_ns"] - (c["execute_ns"] - c["inline_execute_ns"])
        return {"requests": float(requests),
                "frontend_us_per_request": front_ns / n / 1e3,
                "worker_us_per_request": worker_ns / n / 1e3,
                "dispatch_overhead_us": (front_ns + worker_ns) / n / 1e3,
                "execute_us_per_batch": c["execute_ns"] / max(1, c["batches"]) / 1e3,
                "batch1_execute_us": c["execute1_ns"] / c["batches1"] / 1e3 if c["batches1"] else math.nan,
                "batches_of_one": float(c["batches1"]),
                "mean_batch": c["served"] / max(1, c["batches"]),
                "inline_share": c["inline_batches"] / max(1, c["batches"])}

    def close(self, drain: bool = True) -> None:
        """Stop every worker (serving what is queued, or with ``drain=False`` dropping it) and release every
        lease."""
        errors: list[BaseException] = []
        if self.link is not None:  # deliver the hand-offs in flight before the workers drain
            try:
                self.link.close()
            except Exception as exc:
                errors.append(exc)
        for nid in list(self.workers):
            try:
                self._retire(nid, drain)
            except Exception as exc:  # keep releasing the others
                errors.append(exc)
        if self._gc_saved is not None:
            gc.set_threshold(*self._gc_saved)
            gc.unfreeze()
            self._gc_saved = None
        if errors:
            raise errors[0]

    def __enter__(self) -> "LocalServingRuntime":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        """Close; leaving on an exception (an interrupt, a failure) drops what is queued instead of serving it, and
        a failure to close is noted on that exception rather than replacing it."""
        if exc is None:
            self.close()
            return
        try:
            self.close(drain=False)
        except Exception as failure:
            exc.add_note(f"closing the serving runtime also failed: {failure!r}")
