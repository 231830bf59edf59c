"""The torch and data work of the ESCHER policies flow (Bhardwaj, ESCHER, thesis ch. 4): each task reports where it
ran, so the flow can check that the ESLs' ``set_resource`` calls placed it (``flows/escher_policies.py``).

- linear digits classifiers: serving replicas, an affinity producer/consumer pair, HFS team jobs, and the training
  loop of the gang's data-parallel members (``tasks/escher/gang.py``, §4.4e);
- WordCount (§4.5, Fig. 4.5a): shard writers into per-node local folders, a mapper per shard, reducers; the two
  lines of data locality are the writer's ``store_data`` and the mapper's ``{data-<shard>: 1}``;
- AlphaZero (§4.5, Fig. 4.6a): a predictor (torch value network on a GPU slice) makes ``coloc-<id>`` on its node,
  and its board aggregator (CPU) exchanges boards and values with it through a store in that node's local folder;
- EscherTune (§4.5, Fig. 4.6c): short jobs, and the data-parallel workers of a long trial that checkpoint when told to
  stop and resume from that checkpoint wherever they are relaunched.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import time
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import numpy as np
from prefect import task

from gpu.schedulers.escher.api import Escher
from gpu.schedulers.escher.primitives import colocate, store_data
from tasks.digits import digits_tensors
from tasks.runtime.rendezvous import Rendezvous
from tasks.runtime.requests import current_placement, task_ledger

RENDEZVOUS_TIMEOUT = timedelta(seconds=60)  # the patience of a gang's all-reduce or an AlphaZero pair with a slow peer
VOCABULARY = tuple(f"w{i:03d}" for i in range(200))


# -- where a task ran -----------------------------------------------------------------------------
def my_node() -> str:
    """The node this task was placed on."""
    return current_placement().placement.node


def where(started: float) -> dict[str, Any]:
    """The task's node, devices and CUDA_VISIBLE_DEVICES, with its start and end times."""
    p = current_placement()
    return {"node": p.placement.node, "devices": list(p.gpu_indices), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "started": started, "ended": time.time()}


def task_esl() -> Escher:
    """The running task's ESL handle: ``node_spec=None`` is the task's own node (Listing 1, P1)."""
    return Escher(task_ledger(), caller_node=my_node())


def esl_calls(esl: Escher, task_name: str) -> list[dict]:
    """The resources a task's ESL made, as rows of the flow's ``set_resource`` log."""
    return [{"call": "set_resource", "name": c.name, "capacity": c.capacity, "node": c.node, "by": task_name}
            for c in esl.logged()]


def node_folder(workdir: str, node: str) -> Path:
    """A node's local disk in the simulated cluster: only tasks on ``node`` read it without a transfer."""
    folder = Path(workdir) / node
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# -- linear digits classifiers --------------------------------------------------------------------
def digits(shard: int = 0, shards: int = 1):
    """sklearn's 8x8 digits as float tensors; ``shard`` of ``shards`` (every ``shards``-th sample)."""
    x, y = digits_tensors()
    return x[shard::shards], y[shard::shards]


def linear_model(seed: int):
    """A 64 → 10 linear classifier initialised from its own generator (thread-mode tasks share the global RNG)."""
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 10)
    rng = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.01 * torch.randn(param.shape, generator=rng))
    return model


def train(model, steps: int, shard: int = 0, shards: int = 1, average: Callable | None = None) -> list[float]:
    """``steps`` full-batch SGD steps on this shard; ``average`` all-reduces each gradient. Returns the losses
    before each step."""
    import torch

    x, y = digits(shard, shards)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if average is not None:
            for param in model.parameters():
                param.grad = average(param.grad)
        opt.step()
        losses.append(loss.item())
    return losses


def checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _trained(name: str, steps: int, seed: int) -> dict:
    started = time.time()
    model = linear_model(seed)
    train(model, steps)
    return {"task": name, "checksum": checksum(model), **where(started)}


@task
def replica(name: str, steps: int) -> dict:
    """A serving replica warming up its model (anti-affine with the other replicas)."""
    return _trained(name, steps, 0)


@task
def producer(steps: int) -> dict:
    """Trains a model and, from inside the task, makes its own node attractive to its consumers (P1)."""
    out = _trained("producer", steps, 1)
    esl = task_esl()
    colocate(esl, "producer")
    return {**out, "set_resource": esl_calls(esl, "producer")}


@task
def consumer(steps: int) -> dict:
    """Runs where the producer ran (its model would be read from that node's memory)."""
    return _trained("consumer", steps, 2)


@task
def team_job(user: str, i: int, steps: int) -> dict:
    return {**_trained(f"{user}-{i}", steps, 4 + i), "user": user}


# -- WordCount (§4.5, Fig. 4.5a) ------------------------------------------------------------------
def shard_text(shard: int, words: int, seed: int) -> str:
    """The generated text of one input shard: ``words`` words drawn from a Zipf-like vocabulary."""
    rng = np.random.default_rng([seed, shard])
    weights = 1.0 / np.arange(1, len(VOCABULARY) + 1)
    picks = rng.choice(len(VOCABULARY), size=words, p=weights / weights.sum())
    return " ".join(VOCABULARY[i] for i in picks)


def partition_of(word: str, reducers: int) -> int:
    """The reducer of ``word`` (a stable hash: every mapper sends a word to the same reducer)."""
    return zlib.crc32(word.encode()) % reducers


@task
def write_shard(shard: int, words: int, seed: int, workdir: str, locality: bool) -> dict:
    """Data generation: the shard goes to this node's local folder; with locality the writer also marks the node
    (``data-shard-<i>``: the first of WordCount's two lines)."""
    started = time.time()
    path = node_folder(workdir, my_node()) / f"shard-{shard}.txt"
    path.write_text(shard_text(shard, words, seed))
    esl = task_esl()
    if locality:
        store_data(esl, f"shard-{shard}")
    return {"task": f"write-{shard}", "shard": shard, "bytes": path.stat().st_size,
            "set_resource": esl_calls(esl, f"write-{shard}"), **where(started)}


@task
def map_shard(shard: int, source: str, workdir: str, reducers: int) -> dict:
    """Count the words of one shard, read from this node's folder; a shard on another node is first copied here
    (its bytes are the transfer locality saves). Writes one partition file per reducer on this node."""
    started = time.time()
    here = node_folder(workdir, my_node())
    local = here / f"shard-{shard}.txt"
    moved = 0
    if source != my_node():
        shutil.copyfile(node_folder(workdir, source) / local.name, local)
        moved = local.stat().st_size
    outputs = map_text(local.read_text(), shard, reducers, here)
    return {"task": f"map-{shard}", "shard": shard, "source": source, "input_bytes": local.stat().st_size,
            "transfer_bytes": moved, "partitions": outputs, **where(started)}


def map_text(text: str, shard: int, reducers: int, folder: Path) -> list[str]:
    """A mapper's work on one shard's text: count its words and write one partition file per reducer into
    ``folder``; the files' paths (``benchmarks/escher.py`` times this as WordCount's compute per byte)."""
    counts = collections.Counter(text.split())
    parts: list[dict[str, int]] = [{} for _ in range(reducers)]
    for word, n in counts.items():
        parts[partition_of(word, reducers)][word] = n
    outputs = []
    for r, part in enumerate(parts):
        out = folder / f"map-{shard}-{r}.json"
        out.write_text(json.dumps(part))
        outputs.append(str(out))
    return outputs


@task
def reduce_partition(r: int, partitions: list[str]) -> dict:
    """Sum the counts of reducer ``r``'s words over every mapper's partition file."""
    started = time.time()
    total: collections.Counter = collections.Counter()
    for path in partitions:
        total.update(json.loads(Path(path).read_text()))
    return {"task": f"reduce-{r}", "counts": dict(total), **where(started)}


# -- AlphaZero (§4.5, Fig. 4.6a) ------------------------------------------------------------------
BOARD = 9 * 9  # a 9x9 Go board, one float per point


def _pair_store(workdir: str, pair: int):
    """The board/value channel of pair ``pair`` in this node's local folder: the predictor and its aggregator
    reach the same store only when they run on the same node."""
    import torch.distributed as dist

    store = dist.FileStore(str(node_folder(workdir, my_node()) / f"alphazero-{pair}.store"), 2)
    store.set_timeout(RENDEZVOUS_TIMEOUT)
    return store


@task
def predictor(pair: int, rounds: int, workdir: str) -> dict:
    """The PredictorAgent: creates ``coloc-predictor-<pair>`` on its node (Fig. 4.6a's ``set_resource(id, 1)``),
    then evaluates each batch of boards its aggregator sends with a small torch value network on its GPU slice."""
    import torch

    started = time.time()
    esl = task_esl()
    colocate(esl, f"predictor-{pair}", capacity=1)
    torch.set_num_threads(1)
    torch.manual_seed(pair)
    net = torch.nn.Sequential(torch.nn.Linear(BOARD, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1), torch.nn.Tanh())
    store = _pair_store(workdir, pair)
    for i in range(rounds):
        boards = torch.from_numpy(np.frombuffer(store.get(f"boards-{i}"), dtype=np.float32).reshape(-1, BOARD).copy())
        with torch.no_grad():
            values = net(boards).squeeze(1).numpy().astype(np.float32)
        store.set(f"values-{i}", values.tobytes())
    return {"task": f"predictor-{pair}", "pair": pair, "set_resource": esl_calls(esl, f"predictor-{pair}"),
            **where(started)}


@task
def board_aggregator(pair: int, rounds: int, moves: int, workdir: str, seed: int) -> dict:
    """The BoardAggregator: each round expands ``moves`` candidate moves of a random position, sends the boards to
    its predictor and keeps the best move by predicted value (one MCTS expansion + back-up per round)."""
    started = time.time()
    rng = np.random.default_rng([seed, pair])
    store = _pair_store(workdir, pair)
    chosen, latencies = [], []
    for i in range(rounds):
        position = rng.choice([-1.0, 0.0, 1.0], size=BOARD).astype(np.float32)
        empty = np.flatnonzero(position == 0)[:moves]
        boards = np.repeat(position[None, :], len(empty), axis=0)
        boards[np.arange(len(empty)), empty] = 1.0
        sent = time.perf_counter()
        store.set(f"boards-{i}", boards.tobytes())
        values = np.frombuffer(store.get(f"values-{i}"), dtype=np.float32)
        latencies.append(time.perf_counter() - sent)
        chosen.append(int(empty[int(np.argmax(values))]))
    return {"task": f"aggregator-{pair}", "pair": pair, "moves": chosen,
            "exploration_p50_ms": float(np.median(latencies) * 1e3), **where(started)}


# -- EscherTune (§4.5, Fig. 4.6c) -----------------------------------------------------------------
@task
def short_job(i: int, steps: int) -> dict:
    """One of EscherTune's short jobs: a digits classifier trained for ``steps`` steps beside the long trial."""
    return _trained(f"short-{i}", steps, 10 + i)


@task
def trial_worker(trial: str, rank: int, total: int, rendezvous: Rendezvous, checkpoint: str, progress: str,
                 stop: str) -> dict:
    """One data-parallel worker of a trial: resumes from ``checkpoint`` when it exists and trains until the trial has
    done ``total`` steps or any worker sees the ``stop`` file (the move EscherTune decided). Each step the workers sum
    their gradients and, in one more all-reduce, the stop flag and their shards' losses, so they stop at the same step
    and rank 0 appends the whole set's loss to ``progress`` (``step loss time`` lines: the rate the ESL measures).
    Rank 0 saves the model, optimizer and step count to ``checkpoint`` before it stops."""
    import torch

    started = time.time()
    with rendezvous.group(rank) as gang:
        model = linear_model(5)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        step = 0
        if os.path.exists(checkpoint):
            state = torch.load(checkpoint)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            step = state["step"]
        first = step
        x, y = digits(rank, rendezvous.world)
        losses = []
        with open(progress, "a", buffering=1) if rank == 0 else contextlib.nullcontext() as log:
            while step < total:
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                for param in model.parameters():
                    gang.allreduce(param.grad)
                    param.grad /= rendezvous.world
                opt.step()
                step += 1
                shared = torch.tensor([float(os.path.exists(stop)), loss.item() * len(y), len(y)])
                gang.allreduce(shared)
                losses.append(float(shared[1] / shared[2]))
                if log is not None:
                    log.write(f"{step} {losses[-1]} {time.time()}\n")
                if shared[0] > 0:
                    break
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, checkpoint)
    return {"task": f"trial-{trial}-w{rank}-from-{first}", "trial": trial, "rank": rank, "first_step": first,
            "last_step": step, "losses": losses, "final_loss": _loss(model), "checksum": checksum(model),
            **where(started)}


def _loss(model) -> float:
    import torch

    x, y = digits()
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))
