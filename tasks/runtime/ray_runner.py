"""The Ray backend of the GPU task runner: the same placement, executed on a Ray cluster.

The pool ledger runs as one named Ray actor per pool (``gpuflows-ledger-<pool>``), so every
driver on the cluster shares it the way local processes share the SQLite file. The ledger
picks node and devices; the task then runs on that node (``NodeAffinitySchedulingStrategy``)
in a worker whose ``CUDA_VISIBLE_DEVICES`` is the placement's (through ``runtime_env``, so
Ray keeps a separate worker per device set). Ray's own GPU accounting is bypassed
(``num_gpus=0``): the ledger is the single authority, which is what makes fractional,
memory-aware and ephemeral-resource placement behave the same locally and on Ray.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

from gpu.devices import Device, Node, PoolSpec, discover, nvml_devices, parse_simulated
from gpu.ledger import LedgerClient, Lease, PoolLedger, raise_if_wait_over
from gpu.liveness import Owner
from gpu.placement import NodeState, ResourceRequest
from tasks.runtime.requests import PLACEMENT_ENV, TaskPlacement
from tasks.runtime.runners import EngineRaised, PlacingTaskRunner, api_url_env, wait_for_states

NAMESPACE = "gpuflows"
RAY_POOL = "ray:"  # a pool_id of the form ray:<ledger actor name>
WAITERS = "waiters"  # the ledger actor's concurrency group for requests waiting to be granted
WAITER_THREADS = 128
WAIT_CHUNK_S = 1.0  # a waiter's call returns at least this often (its deadline and cancel are the driver's)
CANCEL_POLL_S = 0.05
log = logging.getLogger("gpuflows.ray")


def _node_devices() -> list[dict]:
    return [d.__dict__ for d in nvml_devices()]


def cluster_spec(simulated: str) -> PoolSpec:
    """The pool as Ray sees it: each alive node with its GPUs (NVML on the node, else fake ones
    with the memory of ``simulated``, e.g. '2x16GiB' gives 16 GiB per fake GPU)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    memory = parse_simulated(simulated).devices[0].memory_total if parse_simulated(simulated).devices else 16 * 2**30
    nodes = []
    for n in sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"]):
        count = int(n["Resources"].get("GPU", 0))
        cpus = float(n["Resources"].get("CPU", 0))
        found = ray.get(ray.remote(num_cpus=0)(_node_devices).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()) if count else []
        if found:
            devices = tuple(Device(**d) for d in found[:count])
        else:
            devices = tuple(Device(i, f"SIM-{n['NodeID'][:8]}-{i}", "Simulated GPU", memory, memory, simulated=True)
                            for i in range(count))
        nodes.append(Node(n["NodeID"], devices, cpus))
    return PoolSpec(tuple(nodes))


class RayLedger(LedgerClient):
    """Client of the pool's ledger actor; its heartbeat keeps this driver's leases alive and notices
    the ones the actor took away (a driver on another host that stopped heartbeating). A waiting
    request sleeps in the actor (``await_grant``) and is woken by the grant itself, not by polling."""

    def __init__(self, actor: Any, lease_ttl: float):
        import ray

        super().__init__()
        self._ray = ray
        self._actor = actor
        self.owner = Owner.this_process()
        self.capacity: list[NodeState] = ray.get(actor.get_capacity.remote())
        self._every = lease_ttl / 3
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_loop, daemon=True, name="gpuflows-ray-ledger-heartbeat")
        self._thread.start()

    def _beat_loop(self) -> None:
        while not self._stop.wait(self._every):
            self.beat()

    def beat(self) -> None:
        """Renew this driver's leases; report those the actor no longer has."""
        held = list(self._held)
        try:
            alive = self._ray.get(self._actor.heartbeat.remote(self.owner), timeout=max(self._every, 1.0))
        except (self._ray.exceptions.RayError, TimeoutError) as exc:
            log.warning("heartbeat to the pool's ledger actor failed, retrying: %r", exc)
            return
        for lease_id in held:
            if lease_id not in alive and lease_id in self._held:
                self._lose([lease_id], self._ray.get(self._actor.loss_reason.remote(lease_id)))

    def submit(self, request: ResourceRequest, priority: float = 0.0) -> int:
        return self._ray.get(self._actor.submit.remote(request, priority, self.owner))

    def try_grant(self, ticket: int) -> Lease | None:
        return self._hold(self._ray.get(self._actor.try_grant.remote(ticket, self.owner)))

    def submit_and_try(self, request: ResourceRequest, priority: float = 0.0) -> tuple[int, Lease | None]:
        ticket, placement = self._ray.get(self._actor.submit_and_try.remote(request, priority, self.owner))
        return ticket, self._hold(placement)

    def allocate(self, request: ResourceRequest, timeout: float | None = None,
                 cancel_event: threading.Event | None = None, priority: float = 0.0) -> Lease:
        """``LedgerClient.allocate``, waiting inside the actor: each call sleeps there until a grant
        (``WAIT_CHUNK_S`` at most, so deadlines and ``cancel_event`` stay the driver's)."""
        ticket, placement = self.submit_and_try(request, priority)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while placement is None:
                raise_if_wait_over(request, timeout, deadline, cancel_event)
                chunk = WAIT_CHUNK_S if deadline is None else max(0.0, min(WAIT_CHUNK_S, deadline - time.monotonic()))
                ref = self._actor.await_grant.options(concurrency_group=WAITERS).remote(ticket, self.owner, chunk)
                ready: list = []
                while not ready and not (cancel_event is not None and cancel_event.is_set()):
                    ready, _ = self._ray.wait([ref], timeout=CANCEL_POLL_S if cancel_event is not None else None)
                if ready:
                    outcome = self._ray.get(ref)
                    if isinstance(outcome, BaseException):
                        raise outcome
                    placement = self._hold(outcome)
            return placement
        except BaseException:
            self.cancel(ticket)
            raise

    def grant_all(self, requests: Sequence[ResourceRequest]) -> list[Lease] | None:
        """All of ``requests`` in one actor transaction, or none (ESCHER's FrameSpace gang, §4.4e)."""
        placements = self._ray.get(self._actor.grant_all.remote(list(requests), self.owner))
        return None if placements is None else [self._hold(p) for p in placements]

    def waiting(self) -> int:
        return self._ray.get(self._actor.waiting.remote())

    def cancel(self, ticket: int) -> None:
        self._ray.get(self._actor.cancel.remote(ticket))

    def release(self, lease_id: str) -> bool:
        self._held.pop(lease_id, None)
        self._watchers.pop(lease_id, None)
        return self._ray.get(self._actor.release.remote(lease_id))

    def check(self, placement: Lease) -> None:
        """Raise LeaseLost unless the actor still has this exact lease (fencing)."""
        self._ray.get(self._actor.check.remote(placement))

    def set_resource(self, name: str, capacity: float, node: str | None = None) -> None:
        self._ray.get(self._actor.set_resource.remote(name, capacity, node))

    def adjust_resource(self, name: str, delta: float, node: str | None = None) -> dict[str, float]:
        return self._ray.get(self._actor.adjust_resource.remote(name, delta, node))

    def cluster_status(self) -> dict[str, dict[str, tuple[float, float]]]:
        return self._ray.get(self._actor.cluster_status.remote())

    def lease_resource(self, lease_id: str, name: str, capacity: float) -> None:
        self._ray.get(self._actor.lease_resource.remote(lease_id, name, capacity))

    def free_state(self) -> list[NodeState]:
        return self._ray.get(self._actor.free_state.remote())

    def leases(self) -> list[Lease]:
        return self._ray.get(self._actor.leases.remote())

    def events(self, since_id: int = 0) -> list[dict]:
        return self._ray.get(self._actor.events.remote(since_id))

    def close(self) -> None:
        self._stop.set()


def attach(pool_id: str, lease_ttl: float = 30.0) -> RayLedger:
    """A client of the ledger actor ``pool_id`` (``ray:<actor name>``), from a task running on Ray."""
    import ray

    return RayLedger(ray.get_actor(pool_id[len(RAY_POOL):], namespace=NAMESPACE), lease_ttl)


class _LedgerActor(PoolLedger):
    """PoolLedger in memory inside an actor; owners are remote drivers, kept alive by heartbeat.

    Ledger calls run one at a time (the default concurrency group); ``await_grant`` calls sleep in
    the ``WAITERS`` group and every committed grant wakes them, so a waiting driver learns of its grant
    at once instead of on its next poll."""

    def __init__(self, spec: PoolSpec, policy, lease_ttl: float, name: str = ""):
        super().__init__(spec, None, policy=policy, lease_ttl=lease_ttl, heartbeat=False)
        if name:
            self.pool_id = f"{RAY_POOL}{name}"  # what a task's placement carries to reach this actor
        self._changed = threading.Condition()
        self._grant_rounds = 0

    def _ring(self, owner_keys: set[str]) -> None:
        super()._ring(owner_keys)
        with self._changed:
            self._grant_rounds += 1
            self._changed.notify_all()

    def await_grant(self, ticket: int, owner: Owner, timeout: float) -> Lease | BaseException | None:
        """The lease of ``ticket`` once granted, waiting at most ``timeout`` s (then None); the error
        (returned, not raised: the driver may have stopped listening) if the ticket left the queue.
        It looks again every ``reclaim_interval`` too, which frees what dead drivers hold."""
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                seen = self._grant_rounds
            try:
                placement = self.try_grant(ticket, owner)
            except KeyError as exc:
                return exc
            left = deadline - time.monotonic()
            if placement is not None or left <= 0:
                return placement
            with self._changed:
                self._changed.wait_for(lambda: self._grant_rounds != seen, min(left, self.reclaim_interval))

    def get_capacity(self) -> list[NodeState]:
        return self.capacity

    def loss_reason(self, lease_id: str) -> str:
        return self._loss_reason(lease_id)


def ledger_actor(spec: PoolSpec, policy, lease_ttl: float, name: str, detached: bool = False) -> Any:
    """The pool's ledger actor ``name`` (created, or the one that exists), with its waiters' thread group."""
    import ray

    cls = ray.remote(num_cpus=0, max_concurrency=1, concurrency_groups={WAITERS: WAITER_THREADS})(_LedgerActor)
    return cls.options(name=name, namespace=NAMESPACE, get_if_exists=True,
                       lifetime="detached" if detached else None).remote(spec, policy, lease_ttl, name)


def _run_placed_task(task, task_run_id, parameters, wait_for, dependencies, context, env, node=""):
    """Runs on the Ray worker: hydrate Prefect's context and run the task through its engine, only on
    ``node`` (the placement's): a task that reached another node crashes without running, as it would
    use slices the ledger granted elsewhere."""
    import ray
    from prefect.states import Crashed
    from prefect.task_runners import _run_task_in_subprocess

    here = ray.get_runtime_context().get_node_id()
    if node and here != node:
        return Crashed(message=f"task {task.name!r} reached Ray node {here}, not its placement's node {node}: not run")
    return _run_task_in_subprocess(task=task, task_run_id=task_run_id, parameters=parameters, wait_for=wait_for,
                                   return_type="state", dependencies=dependencies, context=context, env=env)


class GpuRayTaskRunner(PlacingTaskRunner):
    """Places each task on a slice of the Ray cluster's GPUs and runs it there.

    Args:
        address: Ray cluster to join (None: the pool block's ``ray_address``, else a local Ray
            started with the pool's GPUs as Ray GPUs — fake ones on a machine without GPUs).
        init_kwargs: extra ``ray.init`` arguments for a local cluster.
        Other arguments as ``GpuTaskRunner``.
    """

    def __init__(self, pool=None, address: str | None = None, init_kwargs: dict[str, Any] | None = None, **kwargs):
        super().__init__(pool, **kwargs)
        self.address = address
        self.init_kwargs = dict(init_kwargs or {})
        self._owns_ray = False
        self._remote = None

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "address": self.address, "init_kwargs": self.init_kwargs}

    def __enter__(self):
        super().__enter__()
        if self._resolved:  # Ray is up for the flow body, as with prefect_ray's RayTaskRunner; with configure=
            self._connect()  # the run's pool (its ray_address) is known on first use, which connects then
        return self

    def _connect(self) -> str | None:
        """Join (or start) Ray; returns the cluster address, None for a local Ray."""
        import ray

        address = self.address or self.pool.ray_address
        if not ray.is_initialized():
            kwargs = dict(self.init_kwargs)
            if not address:
                local = discover(self.pool.simulated, self.pool.device_backend)
                kwargs.setdefault("num_gpus", local.gpu_count)
                kwargs.setdefault("object_store_memory", 200 * 2**20)
            kwargs.setdefault("namespace", NAMESPACE)
            kwargs.setdefault("log_to_driver", True)
            # "local" starts a private instance even when another Ray runs on this machine
            # (plain None would join the last one started, whose GPUs are not this pool's).
            ray.init(address=address or "local", **kwargs)
            self._owns_ray = True
        return address

    def _open_ledger(self) -> LedgerClient:
        import ray

        address = self._connect()
        actor = ledger_actor(cluster_spec(self.pool.simulated), self.policy.placement_policy(), self.pool.lease_ttl_s,
                             f"gpuflows-ledger-{self.pool.name}", detached=bool(address))
        self._remote = ray.remote(_run_placed_task)
        return RayLedger(actor, self.pool.lease_ttl_s)

    def _execute(self, task, task_run_id, parameters, wait_for, dependencies, placement, cancel_event):
        import ray
        from prefect.states import Crashed
        from prefect.utilities.engine import resolve_inputs_sync
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        placement = placement or Lease("", "", (), 0.0, 0)
        device = "cpu" if placement.simulated or not placement.devices else "cuda:0"
        tp = TaskPlacement(placement, device, placement.cuda_visible_devices)
        # A CPU-only task that reserved no CPUs is bounded by nothing in the ledger; with num_cpus=0
        # Ray would start one worker process per concurrent task. Such tasks take Ray's own default
        # (1 CPU, as with prefect_ray); placed GPU tasks keep the ledger as the only authority.
        cpus = placement.cpus if placement.cpus or placement.devices else 1
        options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": 0, "name": task.name}
        if placement.node and (placement.devices or placement.cpus or placement.resources):
            # only what the ledger holds on a node binds the task there; a CPU-only task that holds nothing
            # goes where Ray finds a free CPU, which spreads such tasks over the nodes as prefect-ray does
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(placement.node, soft=False)
        if placement.devices:
            options["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": placement.cuda_visible_devices,
                                                   "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
        context, settings_env = self._worker_context(task, task_run_id, parameters)
        env = settings_env | api_url_env() | {PLACEMENT_ENV: tp.to_env()}
        ref = self._remote.options(**options).remote(
            task, task_run_id, resolve_inputs_sync(parameters, return_data=True, max_depth=-1),
            wait_for_states(wait_for), dependencies, context, env, placement.node if "scheduling_strategy" in options
            else "")
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=0.5)
                if ready:
                    return ray.get(ref)
                if cancel_event.is_set():
                    ray.cancel(ref, force=True)
        except ray.exceptions.RayTaskError as exc:  # Prefect's engine raised on the worker (its own error)
            raise EngineRaised(exc.as_instanceof_cause()) from exc
        except (ray.exceptions.RayError, ray.exceptions.TaskCancelledError) as exc:
            return Crashed(message=f"task {task.name!r} failed on Ray: {exc!r}")

    def _shutdown_backend(self) -> None:
        import ray

        self._close_ledger()  # its heartbeat talks to Ray
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False
