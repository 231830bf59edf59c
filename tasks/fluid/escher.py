"""FLUID's trials placed by ESCHER (``trial_groups --placement escher``): gangs of data-parallel workers on nodes.

FLUID (thesis §3.3.3) decides each trial's width; ESCHER (Bhardwaj, thesis ch. 4) places it on a pool of several
nodes as EscherTune does (§4.4e "EscherTune", §4.5 Fig. 4.6c): "the Trial abstraction ... wrapped in a ghost task
that ensures gang scheduling and applied co-location on tasks belonging to the same Trial".

* **Workers.** A trial of width ``w >= 1`` runs as ``floor(w)`` worker tasks holding one GPU each; a narrower one
  as one worker holding ``w`` of a GPU. The workers train one model data-parallel: equal shards of the training
  split, gradients averaged every step by a gloo all-reduce whose members meet at a ``Rendezvous``
  (``tasks/runtime/rendezvous.py``, shared with ESCHER's gang; each worker blocks in the collective until all have
  reached it: no polling). A worker that fails (or whose ghost's lease is lost) aborts its peers at the barrier,
  and one failing mid-chunk destroys its process group: the chunk fails within seconds, not after the
  rendezvous's patience, its ghosts are released and the trial keeps its last checkpoint.
* **Where (the ESL).** ``plan_trial_nodes`` (``gpu.schedulers.escher.trials``) picks nodes from the ledger's
  free state: anti-affinity across trials first (nodes running no other trial, Table 4.2's P3 used as a preference), then affinity (all workers on one
  node where they fit, the node the trial is on preferred), else the fewest nodes with the most room. The choice
  becomes the ephemeral resource ``trial-<id>`` with capacity = the trial's workers on each chosen node
  (``set_resource``), deleted where the trial no longer runs.
* **Gang (§4.4e).** One GPU ghost per worker requests ``{trial-<id>: 1}`` and the worker's share; all ghosts are
  granted in one ledger transaction or none (``grant_all``, the FrameSpace design: no partial holds, so trials
  cannot deadlock each other). Each ghost backs a unit ``gang-<trial>-<chunk>-w<rank>`` (``lease_resource``, P4)
  that its worker requests, so the worker runs on the ghost's devices, and the ghost is released when its worker
  ends (success, failure or cancellation alike). A gang that does not fit waits for another gang to end.
* **Migration at DynamicFluid's resize boundaries.** Each chunk of a trial ends with its checkpoint saved; the
  next chunk is planned again. When its nodes change (a resize, or room on one node for every worker), the trial
  migrates as EscherTune does: "checkpoints the current job ..., destroys all current workers ..., assigns
  ephemeral resources to the new target node, and relaunches all worker tasks without modifying their ephemeral
  resource requests": the previous gang has ended, ``trial-<id>`` moves (delete + set), the new gang resumes from
  the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Sequence

from prefect import get_run_logger, task

from gpu.errors import AllocationTimeout, ConfigError
from gpu.placement import ResourceRequest
from gpu.schedulers.escher.api import Escher
from gpu.schedulers.escher.gang import Gang
from gpu.schedulers.escher.trials import TrialNodes, plan_trial_nodes, worker_room, worker_shape
from gpu.scenario import integer
from resource_blocks import GpuPool
from resource_blocks.gpu_pool import MAX_NODES
from tasks.fluid.packing import digits_split
from tasks.fluid.profiling import REFERENCE_SHAPE
from tasks.fluid.trials import model_and_optimizer, train_epochs
from tasks.runtime.rendezvous import GangGroup, Rendezvous, abort_when_failed, abort_when_lost
from tasks.runtime.requests import current_placement, gpu_options
from tasks.runtime.slices import on_slice

PLACEMENTS = ("pool", "escher")
RENDEZVOUS_TIMEOUT = timedelta(seconds=120)  # the patience with a slow, live peer (a lost one aborts the gang)
GANG_TIMEOUT_S = 600.0  # how long a gang may wait for room before the chunk fails
SCALING_ROUNDS = 3  # gangs per width of the scaling measurement
SCALING_ITERATIONS = 3  # separately timed epochs per measuring gang (the fastest of all counts)
@dataclass
class _Gang:
    """One launched chunk of a trial: its workers' futures, how many have not ended, where they meet."""

    trial_id: str
    futures: list
    left: int
    rendezvous: Rendezvous
    launched_at: float = field(default_factory=time.monotonic)
    ended_s: float | None = None  # seconds from launch until its last worker ended


class EscherTrials:
    """Launches FLUID's trial chunks as ESCHER gangs on the flow's pool ledger (see the module docstring).

    ``submit`` has ``tasks.fluid.trials.train_chunk``'s signature and returns rank 0's future, whose result
    has that task's keys plus ``workers`` (each worker's rank, node, devices and start/end times).
    """

    def __init__(self, ledger: Any, timeout_s: float = GANG_TIMEOUT_S):
        self.ledger = ledger
        self.esl = Escher(ledger)
        self.timeout_s = timeout_s
        self.slots = list(range(sum(len(n.devices) for n in ledger.free_state())))
        self.history: list[dict[str, Any]] = []
        self._leaders: list = []  # (gang, rank 0's future) per chunk in ``history``: its workers' records
        self._plans: dict[str, TrialNodes] = {}  # each trial's latest placement (its ``trial-<id>`` resource)
        self._gangs: dict[str, _Gang] = {}
        self._ended = threading.Condition()
        self._folder = Path(tempfile.mkdtemp(prefix="fluid-escher-"))

    # -- the world's side of the ESL ----------------------------------------------------------------------------
    def submit(self, trial_id: str, config: dict[str, Any], start: int, iterations: int, load_from: str | None,
               save_to: str, width: float, seed: int = 0, fail: bool = False, purpose: str = "trial"):
        """Plan, move ``trial-<id>`` if needed, gang-grant the ghosts and launch the workers; rank 0's future.
        ``purpose``: "trial" (a chunk of FLUID's trial) or "scaling" (a gang measuring FLUID's beta)."""
        self._wait(lambda: not self._running(trial_id))  # the previous chunk (checkpoint saved) has fully stopped
        workers, share = worker_shape(width)
        gang = Gang(f"{trial_id}-{start}", tuple(
            ResourceRequest(gpus=share, resources={self._resource(trial_id): 1.0}) for _ in range(workers)))
        waited_from, ghosts, plan = time.monotonic(), None, None
        previous = next((h for h in reversed(self.history) if h["trial"] == trial_id), None)
        while ghosts is None:
            self._forget_idle(trial_id)
            free, others = self.ledger.free_state(), self._others(trial_id)
            plan = plan_trial_nodes(trial_id, workers, share, free, others, previous["nodes"] if previous else {})
            if plan is not None:
                self._place(plan)
                ghosts = self.ledger.grant_all([gang.ghost(i) for i in range(workers)])
            if ghosts is None:
                self._wait_for_room(trial_id, waited_from)
        moved = previous is not None and set(previous["nodes"]) != set(plan.nodes)
        record = {"trial": trial_id, "purpose": purpose, "start": start, "iterations": iterations, "width": width,
                  "workers": workers, "share": share, "nodes": plan.nodes, "anti_affine": plan.anti_affine,
                  "co_located": plan.co_located,
                  "others": {n: sorted(t) for n, t in others.items()},
                  "room_apart": sum(worker_room(n, share) for n in free if not others.get(n.name)),
                  "moved": moved, "from_nodes": previous["nodes"] if previous else None,
                  "resumed_from_checkpoint": load_from is not None, "gang_wait_s": time.monotonic() - waited_from,
                  "ghosts": [{"node": g.node, "devices": list(g.devices)} for g in ghosts]}
        return self._launch(gang, ghosts, record, (config, start, iterations, load_from, save_to, width, seed, fail))

    def _launch(self, gang: Gang, ghosts: list, record: dict[str, Any], args: tuple):
        rendezvous = Rendezvous.create(str(self._folder), f"{gang.gang_id.replace('@', '_')}-", len(ghosts),
                                       RENDEZVOUS_TIMEOUT)
        launched = _Gang(gang.gang_id.rsplit("-", 1)[0], [], len(ghosts), rendezvous)
        with self._ended:
            self._gangs[launched.trial_id] = launched
        try:
            for rank, ghost in enumerate(ghosts):
                unit = f"{gang.resource}-w{rank}"
                self.ledger.lease_resource(ghost.lease_id, unit, 1)  # the worker inherits the ghost's devices
                with gpu_options(resources={unit: 1.0}, label=f"trial {launched.trial_id} w{rank}"):
                    future = train_worker.with_options(name=f"fluid-trial-worker-w{rank}").submit(
                        launched.trial_id, rank, rendezvous, *args)
                launched.futures.append(future)
                abort_when_failed(rendezvous, rank, future)  # before the ghost goes: peers end, then the gang ends
                future.add_done_callback(lambda _, g=ghost: self._ended_one(launched, g))
            abort_when_lost(rendezvous, self.ledger, ghosts)
        except BaseException:
            rendezvous.abort(f"worker {len(launched.futures)} was not launched")
            for ghost in ghosts[len(launched.futures):]:  # roll back the ghosts no worker was launched on
                self._ended_one(launched, ghost)
            raise
        self.history.append({**record, "rendezvous": os.path.dirname(rendezvous.path)})
        self._leaders.append((launched, launched.futures[0]))
        return launched.futures[0]

    def _place(self, plan: TrialNodes) -> None:
        """Make ``trial-<id>`` say ``plan``: set where the trial runs now, deleted where it ran (the move)."""
        name = self._resource(plan.trial_id)
        before = self._plans[plan.trial_id].nodes if plan.trial_id in self._plans else {}
        for node in sorted(set(before) - set(plan.nodes)):
            self.esl.delete_resource(name, node)
        for node, count in plan.counts:
            if before.get(node) != count:
                self.esl.set_resource(name, count, node)
        self._plans[plan.trial_id] = plan

    def scaling_times(self, widths: Sequence[int], seed: int = 0) -> list[float]:
        """Seconds per iteration of the reference MLP run as a gang of each width (FLUID's beta, Eq. 3.2, §3.5).

        Rank 0's slice time per iteration (its shard's work, ``tasks.runtime.slices``); every width runs
        ``SCALING_ROUNDS`` gangs of ``SCALING_ITERATIONS`` separately timed epochs, widths taking turns, and the
        fastest epoch counts (load only ever adds time; the first epoch also pays autograd's warm-up).
        """
        best = {k: float("inf") for k in widths}
        with tempfile.TemporaryDirectory(dir=self._folder) as folder:
            for _ in range(SCALING_ROUNDS):
                for k in widths:
                    out = self.submit(f"scaling-w{k}", dict(REFERENCE_SHAPE), 0, SCALING_ITERATIONS, None,
                                      f"{folder}/w{k}.pt", float(k), seed, purpose="scaling").result()
                    best[k] = min(best[k], *out["epoch_slice_s"])
        return [best[k] for k in widths]

    # -- bookkeeping ---------------------------------------------------------------------------------------------
    @staticmethod
    def _resource(trial_id: str) -> str:
        return f"trial-{trial_id}"

    def _running(self, trial_id: str) -> bool:
        gang = self._gangs.get(trial_id)
        return gang is not None and gang.left > 0

    def _others(self, trial_id: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for tid, plan in self._plans.items():
            if tid != trial_id:
                for node in plan.nodes:
                    out.setdefault(node, set()).add(tid)
        return out

    def _forget_idle(self, trial_id: str) -> None:
        """Trials with no running gang (finished, or between chunks) free their nodes: ``trial-<id>`` deleted."""
        for tid in [t for t in self._plans if t != trial_id and not self._running(t)]:
            for node in self._plans.pop(tid).nodes:
                self.esl.delete_resource(self._resource(tid), node)

    def _ended_one(self, gang: _Gang, ghost) -> None:
        """A worker ended (any state): its ghost goes, and a waiting gang may now fit; the last one removes the
        gang's rendezvous."""
        self.ledger.release(ghost.lease_id)
        with self._ended:
            gang.left -= 1
            if gang.left == 0:
                gang.ended_s = time.monotonic() - gang.launched_at
                gang.rendezvous.remove()
            self._ended.notify_all()

    def _wait(self, ready) -> None:
        with self._ended:
            self._ended.wait_for(ready)

    def _wait_for_room(self, trial_id: str, since: float) -> None:
        """Block until another gang ends; none running means the gang can never fit."""
        with self._ended:
            running = {t: g.left for t, g in self._gangs.items() if g.left > 0 and t != trial_id}
            if not running:
                raise AllocationTimeout(f"trial {trial_id}: its gang does not fit the pool and no other gang runs")
            left = self.timeout_s - (time.monotonic() - since)
            changed = self._ended.wait_for(
                lambda: any(self._gangs[t].left < n for t, n in running.items()), timeout=max(0.0, left))
        if not changed:
            raise AllocationTimeout(f"trial {trial_id}: no room for its gang within {self.timeout_s:g} s")

    def close(self) -> None:
        """Wait for every worker to end, delete every ``trial-<id>`` and the rendezvous files."""
        self._wait(lambda: all(g.left == 0 for g in self._gangs.values()))
        for tid, plan in list(self._plans.items()):
            for node in plan.nodes:
                self.esl.delete_resource(self._resource(tid), node)
        self._plans.clear()
        shutil.rmtree(self._folder, ignore_errors=True)

    def report(self) -> dict[str, Any]:
        """Every chunk's placement: the ESL's nodes, the ghosts' and the workers' nodes and devices, moves; how long
        its gang ran (``ended_s``: launch to its last worker's end) and, if it failed, why rank 0 ended."""
        chunks = []
        for record, (gang, leader) in zip(self.history, self._leaders):
            out = leader.result() if leader.state.is_completed() else None
            chunks.append({**record, "failed": out is None, "workers_ran": out["workers"] if out else [],
                           "resumed_at": out["resumed_at"] if out else None, "ended_s": gang.ended_s,
                           "failure": None if out else leader.state.message})
        return {"chunks": chunks, "slots": len(self.slots),
                "migrations": sum(1 for h in self.history if h["moved"] and h["purpose"] == "trial")}


def nodes_pool(name: str | None, nodes: int) -> GpuPool:
    """A simulated pool of ``nodes`` nodes of two 16 GiB GPUs (``--nodes``): where ESCHER placement has room to act."""
    integer(nodes, "nodes", minimum=1, maximum=MAX_NODES)
    return GpuPool(name=name or f"trial-groups-{nodes}-nodes", device_backend="simulated", simulated="2x16GiB",
                   nodes=nodes)


@contextmanager
def escher_trials(placement: str, runner: Any) -> Iterator[EscherTrials | None]:
    """The flow's chunk launcher for ``placement``: None (the pool pins FLUID's GPUs) or ``EscherTrials`` on the
    flow's GPU task runner's pool ledger."""
    if placement != "escher":
        yield None
        return
    if runner is None:
        raise ConfigError("placement", placement, "needs the flow's GPU task runner (its pool ledger)")
    trials = EscherTrials(runner.ledger())
    try:
        yield trials
    finally:
        trials.close()


# -- the worker --------------------------------------------------------------------------------------------------
def _average_gradients(model, optimizer, gang: GangGroup) -> None:
    """Data parallelism: before every optimizer step the gang's gradients are averaged, in one all-reduce of
    all of them flattened (one collective per step: a small model's step costs about as much as a collective)."""
    import torch

    def mean(*_: Any) -> None:
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        gang.allreduce(flat)
        flat /= gang.world
        for g, avg in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(avg.view_as(g))

    optimizer.register_step_pre_hook(mean)


@task(name="fluid-trial-worker")
def train_worker(trial_id: str, rank: int, rendezvous: Rendezvous, config: dict[str, Any], start: int,
                 iterations: int, load_from: str | None, save_to: str, width: float, seed: int = 0,
                 fail: bool = False) -> dict[str, Any]:
    """One data-parallel worker of a trial's chunk: its shard, gradients averaged with the gang every step.

    Every worker loads the checkpoint (rank 0's parameters are broadcast, so a fresh trial starts identical
    everywhere), trains ``iterations`` epochs over its equal shard of the training split and validates on its
    shard of the validation split (the gang's loss and accuracy are summed over the workers), and posts where
    it ran to the rendezvous store; rank 0 saves the checkpoint and returns ``train_chunk``'s keys with every
    worker's record. ``fail``: the gang's last worker raises before it joins (one lost member: its peers are
    ended by the launcher's abort).
    """
    import torch

    world = rendezvous.world
    placed = current_placement()
    started_at = time.time()
    where = {"rank": rank, "node": placed.placement.node if placed else "", "started_at": started_at,
             "devices": list(placed.gpu_indices) if placed else [], "fraction": placed.fraction if placed else 0.0}
    get_run_logger().info("trial %s worker %d/%d on %s devices %s, iterations %d-%d", trial_id, rank, world,
                          where["node"], where["devices"], start, start + iterations)
    if fail and rank == world - 1:
        raise RuntimeError(f"trial {trial_id}: injected failure of worker {rank}")
    torch.set_num_threads(1)
    with rendezvous.group(rank) as gang:
        device = placed.device if placed is not None else "cpu"
        torch.manual_seed(seed * 100_003 + start + rank)
        xt, yt, xv, yv = digits_split(seed)
        per = len(xt) // world  # equal shards: every worker takes the same steps, so every all-reduce has all
        shard = (xt[rank * per:(rank + 1) * per], yt[rank * per:(rank + 1) * per], xv[rank::world], yv[rank::world])
        data = tuple(t.to(device) for t in shard)
        model, optimizer = model_and_optimizer(config, load_from)
        model.to(device)
        for param in model.parameters():
            gang.broadcast(param.data)  # rank 0's weights everywhere
        _average_gradients(model, optimizer, gang)
        resumed_at = int(torch.load(load_from, weights_only=True)["iterations"]) if load_from else 0
        losses, accuracies, epoch_s = [], [], []
        for _ in range(iterations):  # each epoch timed on the slice: its own sample of the gang's speed
            with on_slice(placed) as clock:
                loss, accuracy = train_epochs(model, optimizer, data, int(config["batch_size"]), 1)
            losses += loss
            accuracies += accuracy
            epoch_s.append(clock.timing.slice_s)
        # the gang's loss and validation accuracy: each worker saw its shards of both
        totals = torch.tensor([v * per for v in losses] + [a * len(shard[3]) for a in accuracies],
                              dtype=torch.float64)
        gang.allreduce(totals)
        losses = [float(v) / (per * world) for v in totals[:iterations]]
        accuracies = [float(v) / len(xv) for v in totals[iterations:]]
        where["finished_at"] = time.time()
        gang.store.set(f"worker-{rank}", json.dumps(where))
        if rank != 0:
            return {"trial_id": trial_id, **where}
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.cpu().state_dict(), "optimizer": optimizer.state_dict(),
                    "iterations": start + iterations}, save_to)
        workers = [json.loads(gang.store.get(f"worker-{r}")) for r in range(world)]  # blocks until each posted
    return {"trial_id": trial_id, "start": start, "iterations": iterations, "resumed_at": resumed_at,
            "loss": losses, "val_accuracy": accuracies, "width": width, "fraction": where["fraction"],
            "devices": [d for w in workers for d in w["devices"]], "device": device,
            "node": ",".join(w["node"] for w in workers), "data_parallel": world, "workers": workers,
            "note": f"{world} data-parallel worker(s) on " + ", ".join(f"{w['node']}:{w['devices']}" for w in workers),
            "slice_s": sum(epoch_s), "epoch_slice_s": epoch_s, "started_at": started_at,
            "finished_at": where["finished_at"]}
