"""ESCHER's policies as the flow runs them: one ``Demo`` per name of ``gpu.schedulers.escher.policies.POLICIES`` (a test
keeps the two the same set), each the
ESL code whose lines are counted (thesis §4.5 counts two for WordCount, five for AlphaZero, fifty for EscherTune;
Fig. 4.7: AppSpace 78) and the call that runs it on real tasks, and ``run_policy``, which runs one with its own ESL
handle and leaves none of that ESL's resources on the pool, whether the policy ends or fails."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from gpu.schedulers.escher.api import Escher
from gpu.schedulers.escher.effort import source_lines
from gpu.schedulers.escher.gang import AppSpaceGang
from gpu.schedulers.escher.hfs import HierarchicalFairShare, water_fill
from gpu.schedulers.escher.primitives import anti_affinity, colocate, store_data, with_task
from gpu.schedulers.escher.tune import consolidation, place_trial, spread_by_availability
from tasks.escher.affinity import run_affinity, run_colocation
from tasks.escher.fair_share import run_hfs
from tasks.escher.gang import run_gang
from tasks.escher.settings import Settings
from tasks.escher.records import esl_log
from tasks.escher.tune import run_tune
from tasks.escher.wordcount import run_locality


@dataclass(frozen=True)
class PolicyRun:
    """What a policy runs with: the pool's ledger and nodes, its own ESL handle, the settings, a scratch folder."""

    ledger: object
    esl: Escher
    nodes: list[str]
    settings: Settings
    workdir: str


@dataclass(frozen=True)
class Demo:
    """One policy of the flow: its MLflow run's name, the ESL code whose lines are counted, the paper's count, and
    the call that runs it (each reads only the settings it needs)."""

    run_name: str
    esl: tuple[Callable | type, ...]
    run: Callable[[PolicyRun], dict]
    paper_lines: str = ""


DEMOS: dict[str, Demo] = {
    "affinity": Demo("anti-affinity-affinity", (anti_affinity, colocate, with_task),
                     lambda r: run_affinity(r.esl, r.settings.steps)),
    "gang": Demo("gang", (AppSpaceGang,), lambda r: run_gang(
        r.ledger, r.esl, r.settings.gang_size, r.settings.steps, r.settings.gang_timeout_s, r.settings.seed,
        r.workdir), "78 (AppSpace; LibSpace 261, FrameSpace 1624)"),
    "hfs": Demo("hfs", (HierarchicalFairShare, water_fill), lambda r: run_hfs(
        r.esl, r.nodes, r.settings.team_weights, r.settings.jobs, r.settings.steps)),
    "locality": Demo("wordcount", (store_data,), lambda r: run_locality(
        r.esl, r.nodes, r.settings.shards, r.settings.words, r.settings.reducers, r.settings.seed, r.workdir), "2"),
    "colocation": Demo("alphazero", (anti_affinity, colocate, with_task), lambda r: run_colocation(
        r.esl, r.settings.pairs, r.settings.rounds, r.settings.seed, r.workdir), "5"),
    "tune": Demo("eschertune", (spread_by_availability, consolidation, place_trial),
                 lambda r: run_tune(r.esl, r.settings.steps, r.workdir), "50"),
}


def run_policy(name: str, ledger, nodes: list[str], settings: Settings, workdir: str) -> dict:
    """Run policy ``name`` with an ESL handle of its own that logs its ``set_resource`` calls; the result carries
    every call (``actions``: the ESL's, the tasks', the ghosts' leases) and the ESL's lines of code."""
    log_path = os.path.join(workdir, f"{name}.jsonl")
    esl = Escher(ledger, log_path=log_path)
    try:
        out = DEMOS[name].run(PolicyRun(ledger, esl, nodes, settings, workdir))
    finally:  # a demo that failed half-way leaves none of its ESL's resources on the pool
        for call in esl.logged():
            esl.delete_resource(call.name, call.node)
    out["actions"] = (esl_log(log_path, name) + out.get("actions", [])
                      + [call for row in out["tasks"] for call in row.pop("set_resource", [])])
    out["esl_lines"] = source_lines(*DEMOS[name].esl)
    return out
