"""Ekya's records of the continuous-retraining flow: a nested MLflow run per window, the retrained models in the
Model Registry, an accuracy-over-time plot, and the Prefect table and chart of the windows. Published through
``tasks.report.records``.

Window run (child of the flow's run from ``flow_mlflow_run_id()``): params ``<stream>.config``,
``<stream>.infer_gpus`` (at the window's start), ``<stream>.retrain_config``, ``<stream>.retrain_gpus``,
``<stream>.retrain_start_s`` and ``<stream>.retrain_state`` (COMPLETED, FAILED, CANCELLED, CRASHED, DISCARDED or NONE:
the window's retraining job, which may start after the window's start, when the thief re-splits the GPUs a finished
job gave back), ``<stream>.deployed_version``; the Prefect table shows the same values (``stream_decisions``); metrics
``<stream>.predicted_accuracy`` (the scheduler's window average), ``<stream>.measured_accuracy``
(true labels), ``<stream>.profiled_accuracy`` / ``<stream>.retrained_val_accuracy`` (predicted vs
reached by the retrained model, golden labels), ``<stream>.predicted_retrain_s`` / ``<stream>.measured_retrain_s``
(the controller's predicted vs the measured retraining duration, slice seconds), ``<stream>.golden_label_accuracy``, the means;
tags ``policy``, ``window``, ``failed_retrains``; artifact ``events.json`` (allocations over time); under
``--executor salus`` also the window's ``salus.*`` metrics (lanes, admission waits, realised vs decided shares).
Each completed retraining is a version of the registered model ``<prefix>-<stream>`` with tags
``window``, ``config``, ``policy``, ``deployed``; the deployed one holds the alias ``champion``. Models are logged with
``serialization_format="pickle"`` (the loaded model is the nn.Module) and an explicit
``torch==2.13.0`` requirement (no requirement inference, no ``+cpu`` label), ENVIRONMENT.md §3.7, §4d.
On the flow run: the table ``ekya-windows-<policy>`` (one row per window and stream) and the chart
``ekya-split-<policy>``.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from gpu.state import state_dir
from tasks.ekya.charts import split_png
from tasks.ekya.salus import LaneReport
from tasks.ekya.window import RunSettings, StreamRuntime, WindowResult
from tasks.ekya.work import small_net
from tasks.report.records import Records
from tasks.report.tables import cell
from tasks.runtime.png import pyplot, save_png

CHAMPION = "champion"  # alias of the registered version each stream serves (``models:/<prefix>-<stream>@champion``)
log = logging.getLogger(__name__)


class WindowLogger:
    """Logs windows of one flow run; every method is a no-op when tracking is off (no parent run)."""

    def __init__(self, run: RunSettings, parent_run_id: str | None):
        self.run = run
        self.records = Records(run.tracking_uri, parent_run_id)

    @property
    def parent_run_id(self) -> str | None:
        return self.records.parent

    def log_window(self, result: WindowResult, streams: list[StreamRuntime]) -> str | None:
        """One nested run for the window, plus a registered model version per completed retraining."""
        if not self.records.enabled:
            return None
        w, policy = result.window, self.run.policy
        rid = self.records.nested(f"{policy}-window-{w}", {"policy": policy, "window": w,
                                                            "failed_retrains": ",".join(result.failures) or "none"})
        jobs = {j.stream: j for j in result.jobs}
        decided = stream_decisions(result)
        params: dict[str, Any] = {"pool_gpus": self.run.pool_gpus, "window_s": self.run.window_s}
        metrics: dict[str, float] = {"mean_measured_accuracy": result.mean_measured,
                                     "mean_predicted_accuracy": sum(result.predicted.values()) / len(result.predicted)}
        for s in streams:
            n = s.spec.name
            job = jobs.get(n)
            d = decided[n]
            params |= {f"{n}.config": result.configs.get(n), f"{n}.infer_gpus": f"{d['infer_gpus']:.2f}",
                       f"{n}.retrain_config": d["retrain_config"], f"{n}.retrain_gpus": f"{d['retrain_gpus']:.2f}",
                       f"{n}.retrain_start_s": "-" if d["retrain_start_s"] is None else f"{d['retrain_start_s']:.2f}",
                       f"{n}.retrain_state": d["retrain_state"], f"{n}.deployed_version": s.version}
            metrics |= {f"{n}.predicted_accuracy": result.predicted[n], f"{n}.measured_accuracy": result.measured[n],
                        f"{n}.golden_label_accuracy": result.profiles[n].golden_accuracy,
                        f"{n}.start_model_accuracy": result.profiles[n].current_accuracy}
            if job is not None:
                metrics[f"{n}.profiled_accuracy"] = job.predicted.accuracy
                metrics[f"{n}.predicted_retrain_s"] = job.expected_s
                if job.result is not None:
                    metrics[f"{n}.measured_retrain_s"] = job.result.slice_s
                    metrics[f"{n}.retrained_val_accuracy"] = job.result.val_accuracy
        self.records.log(rid, params=params, metrics=metrics, step=w,
                         tags={f"{n}.failed": "true" for n in result.failures})
        self.records.json(rid, result.events, "events.json")
        self._register(rid, result, streams)
        self.records.finish(rid)
        return rid

    def log_lanes(self, run_id: str | None, report: LaneReport, window: int) -> None:
        """Add a window's Salus metrics (``--executor salus``) to its MLflow run."""
        if run_id is not None:
            self.records.log(run_id, metrics=report.metrics(), step=window)

    def _register(self, run_id: str, result: WindowResult, streams: list[StreamRuntime]) -> None:
        deployed = {s.spec.name: s.version for s in streams}
        for job in result.jobs:
            if job.outcome != "COMPLETED" or job.result is None:
                continue
            model = small_net(self.run.settings)
            model.load_state_dict(job.result.state)
            name = f"{self.run.registry_prefix}-{job.stream}"
            version = self.records.model(run_id, model.eval(), job.stream, name)
            tags = {"window": str(result.window), "config": job.config.name, "policy": self.run.policy,
                    "deployed": str(deployed[job.stream] == f"w{result.window}-{job.config.name}").lower(),
                    "val_accuracy": f"{job.result.val_accuracy:.4f}"}
            for k, v in tags.items():
                self.records.client.set_model_version_tag(name, version, k, v)
            if tags["deployed"] == "true":  # the version serving the stream now: alias champion
                self.records.client.set_registered_model_alias(name, CHAMPION, version)

    def log_plot(self, results: list[WindowResult]) -> str:
        """Accuracy over (slice) time per stream as a PNG in the state folder, logged to the flow's run as
        ``charts/accuracy.png``, beside the run's other charts."""
        fig, ax = pyplot().subplots(figsize=(9, 4))
        names = sorted({n for r in results for n, *_ in r.segments})
        for k, name in enumerate(names):
            xs, ys = [], []
            for r in results:
                off = r.window * self.run.window_s
                for n, t0, t1, _, seg in r.segments:
                    if n == name and seg.frames:
                        xs += [off + t0, off + t1]
                        ys += [seg.correct / seg.frames] * 2
            ax.plot(xs, ys, color=f"C{k}", label=name, lw=1.2)
        for r in results:
            ax.axvline(r.window * self.run.window_s, color="grey", lw=0.6, ls=":")
            ax.hlines(r.mean_measured, r.window * self.run.window_s, (r.window + 1) * self.run.window_s,
                      colors="black", lw=2)
        mean = sum(r.mean_measured for r in results) / len(results)
        ax.set(xlabel="time (slice s)", ylabel="inference accuracy", ylim=(0, 1.02),
               title=f"Ekya continuous retraining, policy={self.run.policy}: mean {mean:.3f} (black: window means)")
        ax.legend(loc="lower left", ncol=len(names), fontsize=8)
        # one folder per run, one artifact name for every run: MLflow's Compare view shows policies side by side
        out = state_dir() / "ekya" / "plots" / f"{self.run.policy}-{self.parent_run_id or 'untracked'}" / "accuracy.png"
        fig.tight_layout()
        save_png(fig, out, dpi=110)
        self.records.file(None, out, "charts")
        return str(out)

    def publish_windows(self, slug: str, results: list[WindowResult]) -> None:
        """Ekya's table (``ekya-windows-<slug>``) and its chart (``ekya-split-<slug>``: the GPU split per stream
        beside accuracy per window, also ``charts/`` of the flow's MLflow run)."""
        policy = self.run.policy
        self.records.table(f"ekya-windows-{slug}", window_rows(results),
                           f"Ekya {slug}: per window and stream, the window's retraining job (configuration, GPUs, "
                           "how it ended and when it started, in slice seconds: the thief may start one mid-window "
                           "with GPUs a finished job gave back), the inference GPUs at the window's start, then the "
                           "accuracy predicted and measured")
        windows = [{"window": r.window, "split": dict(r.start_alloc), "accuracy": dict(r.measured),
                    "predicted": dict(r.predicted)} for r in results]
        try:
            png = split_png(windows, title=f"Ekya {slug}: GPU split beside accuracy")
        except Exception as exc:  # noqa: BLE001 - a chart never fails the flow
            log.warning("could not draw Ekya's split chart of %s: %r", policy, exc)
            return
        self.records.chart(png, f"ekya-split-{slug}", f"Ekya {slug}: GPU split per stream beside accuracy per window",
                           "Left: GPUs each stream got at each window's start, for inference (solid) and retraining "
                           "(hatched); right: accuracy measured (solid) and predicted (dashed).")


def stream_decisions(result: WindowResult) -> dict[str, dict[str, Any]]:
    """Per stream, what the window decided, as both the Prefect table and the window's MLflow run show it:
    inference GPUs at the window's start, and the window's retraining job (config, GPUs, when it started in slice
    seconds, how it ended), which may start after the window's start, when the thief re-splits GPUs a finished
    job gave back (Ekya §2.4.2). Read from the start-of-window split alone, such a stream showed "none / 0 GPUs"
    in Prefect while MLflow said it retrained on 0.60 GPUs."""
    jobs = {j.stream: j for j in result.jobs}
    out = {}
    for stream in result.measured:
        job = jobs.get(stream)
        out[stream] = {"infer_gpus": float(result.start_alloc.get(f"{stream}/infer", 0.0)),
                       "retrain_config": job.config.name if job else "none",
                       "retrain_gpus": float(job.gpus) if job else 0.0,
                       "retrain_start_s": float(job.start) if job else None,
                       "retrain_state": job.outcome if job else "NONE"}
    return out


def window_rows(results: Iterable[WindowResult]) -> list[dict[str, Any]]:
    """Ekya's table: one row per window and stream, the decision first, 8 columns.

    Laid out per window, every stream added 5 columns (measured, predicted, config, inference and
    retraining GPUs): 23 with 4 streams, the decisions off-screen at 1600 px. Per window and stream the
    table stays 8 columns wide whatever the number of streams; a window's streams are adjacent rows, so
    the split between them reads down the GPU columns. The retraining columns are the window's job
    (``stream_decisions``, as its MLflow run has them); ``retraining`` says how it ended and when it started.
    ``results``: ``tasks.ekya.window.WindowResult``.
    """
    rows = []
    for r in results:
        for stream, d in stream_decisions(r).items():
            start = d["retrain_start_s"]
            rows.append({"window": r.window, "stream": stream, "retrain_config": d["retrain_config"],
                         "retrain_gpus": cell(d["retrain_gpus"]),
                         "retraining": "none" if start is None else f"{d['retrain_state'].lower()} from {start:.2f} s",
                         "infer_gpus": cell(d["infer_gpus"]), "predicted": cell(r.predicted.get(stream)),
                         "measured": cell(r.measured[stream])})
    return rows
