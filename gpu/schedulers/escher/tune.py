"""EscherTune's ESL (Bhardwaj, ESCHER, thesis §4.5, Fig. 4.6c): when a trial should move, and the move itself, as
``set_resource`` calls on the trial's ``trial-<id>`` resource. ``tasks/escher/tune.py`` runs it on real tasks:
the trial checkpoints, ``trial-<id>`` moves, and the relaunched task, with unchanged requests, resumes there."""

from __future__ import annotations

from gpu.schedulers.escher.api import Escher, NodeSpec

EVERY_NODE = NodeSpec()


def migration_target(status: dict[str, dict[str, tuple[float, float]]], current: str) -> str | None:
    """EscherTune's trigger (§4.5): another node with an idle GPU, where the trial's workers fit together."""
    return next((n for n, res in sorted(status.items()) if n != current and res.get("GPU", (0, 0))[1] >= 1), None)


def migrate_trial(esl: Escher, trial: str, node: str) -> None:
    """EscherTune's migration (§4.5, Fig. 4.6c): after the trial's checkpoint, ``trial-<id>`` moves to ``node``;
    the relaunched workers keep their requests and so land there."""
    esl.delete_resource(f"trial-{trial}", EVERY_NODE)
    esl.set_resource(f"trial-{trial}", 1, node)
