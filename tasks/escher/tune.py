"""EscherTune on real tasks (Bhardwaj, ESCHER, thesis §4.5, Fig. 4.6c): a trial trains and checkpoints, the ESL
moves ``trial-<id>`` to a node with an idle GPU, and the relaunched task, with unchanged requests, resumes from the
checkpoint there."""

from __future__ import annotations

from pathlib import Path

from gpu.schedulers.escher.api import Escher
from gpu.schedulers.escher.tune import migrate_trial, migration_target
from tasks.escher.jobs import trial_chunk
from tasks.runtime.requests import gpu_options


def run_tune(esl: Escher, nodes: list[str], steps: int, workdir: str) -> dict:
    """One trial, two chunks: train and checkpoint on the first node, migrate, resume on the node chosen."""
    trial, checkpoint = "long", str(Path(workdir) / "trial-long.pt")
    request = {"gpus": 0.5, "resources": {f"trial-{trial}": 1}}
    esl.set_resource(f"trial-{trial}", 1, nodes[0])
    with gpu_options(**request):
        before = trial_chunk.with_options(name=f"trial-{trial}-0").submit(trial, steps, checkpoint).result()
    target = migration_target(esl.get_cluster_status(), before["node"])
    if target is None:
        raise RuntimeError(f"EscherTune: no node but {before['node']} has an idle GPU for trial-{trial} to move to")
    migrate_trial(esl, trial, target)
    with gpu_options(**request):
        after = trial_chunk.with_options(name=f"trial-{trial}-1").submit(trial, steps, checkpoint).result()
    esl.delete_resource(f"trial-{trial}", target)
    return {"before": before, "after": after, "tasks": [before, after],
            "metrics": {"resumed_step": after["first_step"], "loss_at_checkpoint": before["final_loss"],
                        "loss_on_resume": after["losses"][0], "final_loss": after["final_loss"]}}
