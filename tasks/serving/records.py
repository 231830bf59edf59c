"""The serving rollout's records: its figures, time series and plot on the flow's MLflow run, one nested run per
epoch, and the Prefect table ``serving-rollout-epochs``. Published through ``tasks.report.records``.

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
from tasks.report.records import Records
from tasks.runtime.png import pyplot
from tasks.serving.epochs import feedback_series
from tasks.serving.figures import EpochMark
from tasks.serving.spec import ServingSpec

EPOCH_COLUMNS = ("epoch", "start_s", "end_s", "replanned", "gpus", "unassigned_rps", "offered_rps", "throughput_rps",
                 "slo_attainment", "bad_rate", "p99_latency_ms")


def plan_summary(plan: Plan) -> str:
    """One line per GPU node of ``plan``: duty cycle, occupancy and each session's batch."""
    return "; ".join(f"gpu{n.node_id} d={n.duty_cycle_ms:.2f}ms occ={n.occupancy:.2f} ["
                     + ", ".join(f"{p.session_id} b{p.batch}" for p in n.placements) + "]" for n in plan.nodes)


def plot_rollout(result: dict, beacons: list[dict], marks: list[EpochMark], path: Path) -> Path:
    """Offered and good rate, GPUs, and bad rate per beacon, with the epochs marked (dashed: a re-plan)."""
    plt = pyplot()
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


def publish_epochs(records: Records, sp: ServingSpec, epochs: list[dict]) -> None:
    """The table ``serving-rollout-epochs``: GPUs planned, load and SLO figures per epoch."""
    records.table("serving-rollout-epochs", [{k: e[k] for k in EPOCH_COLUMNS} for e in epochs],
                  f"Nexus epochs of {sp.name}: GPUs planned, load and SLO figures per epoch")


def log_rollout(records: Records, sp: ServingSpec, result: dict, marks: list[EpochMark], beacons: list[dict],
                profiles: Mapping[str, BatchProfile]) -> str | None:
    """The figures, series and plot on ``records``' run, and per-epoch nested runs under it; returns the run id."""
    series = [(f"series_{k}", float(b[k]), int(round(b["t_s"]))) for b in beacons
              for k in ("offered_rps", "throughput_rps", "bad_rate", "gpus", "gpu_share")]
    series += feedback_series(result["orloj_epochs"], result["nona_epochs"], result["queries"])
    records.log(metrics={k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
                series=series, params={"spec": sp.name, "batch_policy": sp.batch_policy,
                                       "load_balancer": sp.load_balancer, "preset": sp.preset,
                                       "models": ",".join(sp.models), "placement": sp.placement})
    keys = ("gpus", "unassigned_rps", "offered_rps", "throughput_rps", "slo_attainment", "bad_rate", "dropped",
            "late", "mean_batch", "p50_latency_ms", "p99_latency_ms", "start_s", "end_s")
    for e, m in zip(result["epochs"], marks):
        run = records.nested(f"epoch-{e['epoch']}", {"nexus.replanned": e["replanned"]})
        records.log(run, metrics={k: e[k] for k in keys}, step=e["epoch"],
                    params={"plan": plan_summary(m.plan), "epoch": e["epoch"]})
        records.text(run, json.dumps(e["plan"], indent=1), "plan.json")
        records.finish(run)
    folder = Path(tempfile.mkdtemp(prefix="serving-rollout-"))
    records.file(None, plot_rollout(result, beacons, marks, folder / "serving_rollout.png"), "serving")
    records.text(None, json.dumps({m: {"batches": list(p.batches), "latency_ms": list(p.latency_ms)}
                                   for m, p in profiles.items()}), "serving/profiles.json")
    records.text(None, json.dumps(result, indent=1, default=str), "serving/summary.json")
    records.close()
    return records.parent
