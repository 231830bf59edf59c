"""WordCount with and without ESCHER's data locality on real tasks (Bhardwaj, ESCHER, thesis §4.5, Fig. 4.5a):
the paper's two lines are the writer's ``store_data`` and the mapper's ``{data-<shard>: 1}``; the bytes a mapper
copies from another node's folder are what locality saves."""

from __future__ import annotations

import time
from pathlib import Path

from gpu.schedulers.escher.api import Escher
from tasks.escher.jobs import map_shard, reduce_partition, write_shard
from tasks.runtime.requests import gpu_options


def run_wordcount(nodes: list[str], shards: int, words: int, reducers: int, seed: int, workdir: str,
                  locality: bool) -> dict:
    """One WordCount job (§4.5, Fig. 4.5a): shard ``i`` is written on node ``i mod N``, a mapper per shard,
    ``reducers`` reducers. With ``locality`` the writer marks its node and the mapper requests the mark (the
    paper's two lines); without, a mapper lands wherever the pool places a 1-CPU task and copies its shard over."""
    folder = str(Path(workdir) / ("locality" if locality else "no-locality"))
    writes = []
    for i in range(shards):
        with gpu_options(node=nodes[i % len(nodes)]):  # the input is already spread over the nodes' disks
            writes.append(write_shard.with_options(name=f"write-{i}").submit(i, words, seed, folder, locality))
    written = [f.result() for f in writes]
    started = time.time()
    maps = []
    for w in written:
        need = {f"data-shard-{w['shard']}": 1} if locality else {}  # the mapper's line
        with gpu_options(cpus=1, resources=need):
            maps.append(map_shard.with_options(name=f"map-{w['shard']}").submit(w["shard"], w["node"], folder,
                                                                                 reducers))
    mapped = [f.result() for f in maps]
    reduces = [reduce_partition.with_options(name=f"reduce-{r}").submit(r, [m["partitions"][r] for m in mapped])
               for r in range(reducers)]
    reduced = [f.result() for f in reduces]
    makespan = time.time() - started
    counts: dict[str, int] = {}
    for r in reduced:
        counts.update(r.pop("counts"))
    moved, total = sum(m["transfer_bytes"] for m in mapped), sum(m["input_bytes"] for m in mapped)
    return {"written": written, "maps": mapped, "reduces": reduced, "counts": counts, "makespan_s": makespan,
            "transfer_bytes": moved, "input_bytes": total, "transfer_share": moved / total}


def run_locality(esl: Escher, nodes: list[str], shards: int, words: int, reducers: int, seed: int,
                 workdir: str) -> dict:
    """WordCount without and with the data-locality ESL; the marks are deleted once the job is done."""
    plain = run_wordcount(nodes, shards, words, reducers, seed, workdir, locality=False)
    local = run_wordcount(nodes, shards, words, reducers, seed, workdir, locality=True)
    for w in local["written"]:
        esl.delete_resource(f"data-shard-{w['shard']}", w["node"])
    tasks = [{**row, "task": f"{label}-{row['task']}"} for label, run in (("plain", plain), ("local", local))
             for row in run["written"] + run["maps"] + run["reduces"]]
    return {"no_locality": plain, "locality": local, "tasks": tasks,
            "metrics": {f"{label}_{k}": run[k] for label, run in (("no_locality", plain), ("locality", local))
                        for k in ("makespan_s", "transfer_bytes", "transfer_share")}}
