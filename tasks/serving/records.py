"""The serving rollout in MLflow: its figures, time series and plot on the flow's run, one nested run per epoch.

What Nexus (Shen et al., SOSP'19, §7) plots over a trace — offered and good rate, GPUs in the plan, bad rate —
goes to the parent run as ``series_*`` metrics (step = second of trace) and a figure; ORLOJ's re-profiling and
Nona's re-solving per epoch as their series (``tasks.serving.epochs.feedback_series``); each planner epoch is a
nested run with its plan.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Mapping

from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.schedulers.nexus.squishy import Plan
from resource_blocks import MlflowTarget
from tasks.serving.figures import EpochMark
from tasks.serving.spec import ServingSpec


def plan_summary(plan: Plan) -> str:
    """One line per GPU node of ``plan``: duty cycle, occupancy and each session's batch."""
    return "; ".join(f"gpu{n.node_id} d={n.duty_cycle_ms:.2f}ms occ={n.occupancy:.2f} ["
                     + ", ".join(f"{p.session_id} b{p.batch}" for p in n.placements) + "]" for n in plan.nodes)


def plot_rollout(result: dict, beacons: list[dict], marks: list[EpochMark], path: Path) -> Path:
    """Offered and good rate, GPUs, and bad rate per beacon, with the epochs marked (dashed: a re-plan)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [b["t_s"] for b in beacons]
    fig, ax = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    ax[0].plot(t, [b["offered_rps"] for b in beacons], label="offered")
    ax[0].plot(t, [b["throughput_rps"] for b in beacons], label="good (within SLO)")
    ax[0].set_ylabel("requests/s")
    ax[0].legend()
    ax[1].step(t, [b["gpus"] for b in beacons], where="post", label="GPU nodes in plan")
    ax[1].step(t, [b["gpu_share"] for b in beacons], where="post", label="GPU share leased")
    ax[1].set_ylabel("GPUs")
    ax[1].legend()
    ax[2].plot(t, [b["bad_rate"] for b in beacons], color="tab:red")
    ax[2].set_ylabel("bad rate")
    ax[2].set_xlabel("seconds")
    for m in marks[1:]:
        for a in ax:
            a.axvline(m.t_s, color="grey", ls="--" if m.replanned else ":", lw=0.8)
    fig.suptitle(f"Nexus rollout of {result['spec']} ({result['batch_policy']}); dashed: re-plan")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def log_rollout(tracking: MlflowTarget, parent: str | None, sp: ServingSpec, result: dict, marks: list[EpochMark],
                beacons: list[dict], profiles: Mapping[str, BatchProfile]) -> str:
    """Per-epoch nested runs under ``parent`` (or a run of our own when no runner opened one)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    from tasks.serving.epochs import feedback_series
    from tasks.runtime.tracking import ensure_experiment

    client = MlflowClient(tracking.resolved_uri())
    if parent is None:
        exp_id = ensure_experiment(client, tracking.experiment)
        parent = client.create_run(exp_id, run_name=f"serving-rollout-{sp.name}").info.run_id
        own = True
    else:
        exp_id, own = client.get_run(parent).info.experiment_id, False
    now = 0
    flat = {k: float(v) for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    metrics = [Metric(k, v, now, 0) for k, v in flat.items()]
    for b in beacons:
        step = int(round(b["t_s"]))
        metrics += [Metric(f"series_{k}", float(b[k]), now, step)
                    for k in ("offered_rps", "throughput_rps", "bad_rate", "gpus", "gpu_share")]
    metrics += [Metric(k, v, now, step) for k, v, step in
                feedback_series(result["orloj_epochs"], result["nona_epochs"], result["queries"])]
    client.log_batch(parent, metrics=metrics, params=[
        Param("spec", sp.name), Param("batch_policy", sp.batch_policy), Param("load_balancer", sp.load_balancer),
        Param("preset", sp.preset), Param("models", ",".join(sp.models)), Param("placement", sp.placement)])
    for e, m in zip(result["epochs"], marks):
        run = client.create_run(exp_id, run_name=f"epoch-{e['epoch']}", tags={"mlflow.parentRunId": parent,
                                                                            "nexus.replanned": str(e["replanned"])})
        keys = ("gpus", "unassigned_rps", "offered_rps", "throughput_rps", "slo_attainment", "bad_rate", "dropped",
                "late", "mean_batch", "p50_latency_ms", "p99_latency_ms", "start_s", "end_s")
        client.log_batch(run.info.run_id, metrics=[Metric(k, float(e[k]), now, e["epoch"]) for k in keys],
                         params=[Param("plan", plan_summary(m.plan)[:6000]), Param("epoch", str(e["epoch"]))])
        client.log_text(run.info.run_id, json.dumps(e["plan"], indent=1), "plan.json")
        client.set_terminated(run.info.run_id)
    folder = Path(tempfile.mkdtemp(prefix="serving-rollout-"))
    client.log_artifact(parent, str(plot_rollout(result, beacons, marks, folder / "serving_rollout.png")), "serving")
    client.log_text(parent, json.dumps({m: {"batches": list(p.batches), "latency_ms": list(p.latency_ms)}
                                        for m, p in profiles.items()}), "serving/profiles.json")
    client.log_text(parent, json.dumps(result, indent=1, default=str), "serving/summary.json")
    if own:
        client.set_terminated(parent)
    return parent

