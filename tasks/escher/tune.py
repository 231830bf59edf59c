"""EscherTune on real tasks (Bhardwaj, ESCHER, thesis §4.5–4.6, Fig. 4.6c): short jobs load-balanced over the nodes,
then a long data-parallel trial spread over the nodes by GPU availability; when a short job's end leaves a node with
room for all the trial's workers, the ESL consolidates the trial there: the workers checkpoint and stop,
``trial-<id>`` moves, and the relaunched workers, with unchanged requests, resume from the checkpoint.

The flow is the ESL's world. Every ``POLL_S`` it reads the ledger's free state and the trial's measured progress
(rank 0's ``step loss time`` lines) and asks ``consolidation`` (``gpu.schedulers.escher.tune``) whether to move: the
trigger is room appearing and the trial's own measurements (its rate since its launch, what that launch cost), never
a step count fixed in advance.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from prefect.futures import wait

from gpu.schedulers.escher.api import Actions, Escher, SetResource
from gpu.schedulers.escher.trials import worker_room
from gpu.schedulers.escher.tune import TrialProgress, consolidation, place_trial, spread_by_availability
from tasks.escher.jobs import RENDEZVOUS_TIMEOUT, short_job, trial_worker
from tasks.runtime.rendezvous import Rendezvous, abort_when_failed
from tasks.runtime.requests import gpu_options

TRIAL, WORKERS, SHARE = "long", 2, 0.5
"""The long trial: two data-parallel workers of half a GPU each. The short jobs take half a GPU too and fill every
node but one worker's room (``lb-short``: the load-balancing resource of Table 4.2 with that capacity per node), so
the trial starts spread, as the paper's 4-GPU job beside five 1-GPU jobs on 3 x 4 GPUs, and fits on one node once a
short job there has ended (Fig. 4.6c at pool scale)."""
TRIAL_LENGTH, SHORT_LENGTH = 100, 10
"""The trial trains ``TRIAL_LENGTH x steps`` steps; short job ``i`` trains ``SHORT_LENGTH x steps x (i + 1)``, so the
short jobs end one after another while the trial runs."""
POLL_S = 0.05
"""How often the ESL looks at the ledger and the trial's progress (s)."""


@dataclass
class _Launch:
    """One launch of the trial's workers: where, their futures, when, and the files they report through."""

    counts: tuple[tuple[str, int], ...]
    futures: list
    rendezvous: Rendezvous
    launched_at: float = field(default_factory=time.time)

    def progress(self, path: str, total: int, until: float = float("inf")) -> TrialProgress | None:
        """The trial's rate and launch cost from rank 0's lines of this launch (written before ``until``, the next
        launch); None before two steps."""
        rows = _rows(path, self.launched_at, until)
        if len(rows) < 2 or rows[-1][2] <= rows[0][2]:
            return None
        (first, _, t0), (last, _, t1) = rows[0], rows[-1]
        return TrialProgress(int(last), total, (last - first) / (t1 - t0), t0 - self.launched_at)


def _rows(path: str, since: float, until: float) -> list[tuple[float, float, float]]:
    """Rank 0's complete ``step loss time`` lines written between ``since`` and ``until``."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [tuple(map(float, line.split())) for line in f if line.endswith("\n")]
    return [r for r in rows if since <= r[2] < until]


def _launch(esl: Escher, counts, total: int, files: dict[str, str], workdir: str) -> _Launch:
    """Place ``trial-<id>`` on ``counts`` and launch the workers, requests unchanged from launch to launch."""
    place_trial(esl, TRIAL, counts)
    rendezvous = Rendezvous.create(workdir, f"trial-{TRIAL}-", WORKERS, RENDEZVOUS_TIMEOUT)
    launch = _Launch(tuple(counts), [], rendezvous)
    for rank in range(WORKERS):
        with gpu_options(gpus=SHARE, resources={f"trial-{TRIAL}": 1}):
            launch.futures.append(trial_worker.with_options(name=f"trial-{TRIAL}-w{rank}").submit(
                TRIAL, rank, total, rendezvous, files["checkpoint"], files["progress"], files["stop"]))
        abort_when_failed(rendezvous, rank, launch.futures[-1])
    return launch


def _ended(launch: _Launch) -> list[dict]:
    """The launch's workers' rows once every one has ended (the first failure raised)."""
    wait(launch.futures)
    launch.rendezvous.remove()
    return sorted((f.result() for f in launch.futures), key=lambda r: r["rank"])


def _load_balance_short_jobs(esl: Escher) -> int:
    """``lb-short`` on every node with capacity = the short jobs that leave it room for one trial worker; how many."""
    slots = {n.name: worker_room(n, SHARE) - 1 for n in esl.ledger.free_state()}
    esl.apply(Actions(tuple(SetResource("lb-short", float(k), n) for n, k in sorted(slots.items()) if k > 0)))
    return sum(k for k in slots.values() if k > 0)


def _held_by_all(esl: Escher, resource: str, count: int, futures: list) -> None:
    """Wait until ``count`` leases hold ``resource`` (every short job has its slice) or one of ``futures`` ended."""
    while sum(resource in lease.resources for lease in esl.ledger.leases()) < count:
        done, _ = wait(futures, timeout=POLL_S)
        if done:
            return


def run_tune(esl: Escher, steps: int, workdir: str) -> dict:
    """Short jobs load-balanced over the nodes, the long trial spread by availability, consolidated once room and its
    measurements say so; returns every launch's workers, the moves and what was measured. The ESL's resources
    (``lb-short``, ``trial-long``) are deleted by ``run_policy`` once the run ends or fails."""
    total = TRIAL_LENGTH * steps
    files = {k: str(Path(workdir) / f"trial-{TRIAL}.{k}") for k in ("checkpoint", "progress", "stop")}
    shorts = []
    for i in range(_load_balance_short_jobs(esl)):
        with gpu_options(gpus=SHARE, resources={"lb-short": 1}):
            shorts.append(short_job.with_options(name=f"short-{i}").submit(i, SHORT_LENGTH * steps * (i + 1)))
    try:
        _held_by_all(esl, "lb-short", len(shorts), shorts)
        counts = spread_by_availability(esl.ledger.free_state(), WORKERS, SHARE)
        if counts is None:
            raise RuntimeError(f"EscherTune: no room for trial-{TRIAL}'s {WORKERS} workers of {SHARE} GPU beside the "
                               "short jobs")
        launches = [_launch(esl, counts, total, files, workdir)]
        rows, moves = [], []
        while True:
            launch = launches[-1]
            done, _ = wait(launch.futures, timeout=POLL_S)
            decision = None
            if len(done) < WORKERS:
                measured = launch.progress(files["progress"], total)
                decision = consolidation(esl.ledger.free_state(), dict(launch.counts), SHARE, measured)
                if decision is None:
                    continue
                Path(files["stop"]).touch()  # the workers checkpoint and stop at the same step
            ended = _ended(launch)
            rows.append(ended)
            if ended[0]["last_step"] >= total:
                break
            os.remove(files["stop"])
            moves.append({"at_step": ended[0]["last_step"], "from": dict(launch.counts), "to": decision.nodes,
                          "remaining_s": decision.remaining_s, "launch_s": decision.launch_s,
                          "rate": measured.rate})
            launches.append(_launch(esl, decision.counts, total, files, workdir))
    finally:  # the short jobs end on their own; the run returns (or fails) only once they have
        if shorts:
            wait(shorts)
    ends = [launch.launched_at for launch in launches[1:]] + [float("inf")]
    rates = [launch.progress(files["progress"], total, end) for launch, end in zip(launches, ends)]
    short_rows = [f.result() for f in shorts]
    before, after = rows[0][0], rows[-1][0]
    return {"short_jobs": short_rows, "launches": rows, "moves": moves, "before": before, "after": after,
            "placements": [dict(launch.counts) for launch in launches],
            "tasks": short_rows + [row for launch_rows in rows for row in launch_rows],
            "metrics": {"moves": len(moves), "nodes_before": len(launches[0].counts),
                        "nodes_after": len(launches[-1].counts), "moved_at_step": moves[0]["at_step"] if moves else -1,
                        "rate_spread_steps_s": rates[0].rate if rates[0] else 0.0,
                        "rate_after_steps_s": rates[-1].rate if rates[-1] else 0.0,
                        "resumed_step": after["first_step"], "loss_at_checkpoint": before["final_loss"],
                        "loss_on_resume": after["losses"][0], "final_loss": after["final_loss"]}}
