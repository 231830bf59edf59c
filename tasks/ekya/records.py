"""MLflow records of the continuous-retraining flow: a nested run per window, the retrained models
in the Model Registry, and an accuracy-over-time plot.

Window run (child of the flow's run from ``flow_mlflow_run_id()``): params ``<stream>.config``,
``<stream>.infer_gpus``, ``<stream>.retrain_gpus``, ``<stream>.retrain_state`` (COMPLETED, FAILED,
CANCELLED, CRASHED, DISCARDED or NONE), ``<stream>.deployed_version``; metrics
``<stream>.predicted_accuracy`` (the scheduler's window average), ``<stream>.measured_accuracy``
(true labels), ``<stream>.profiled_accuracy`` / ``<stream>.retrained_val_accuracy`` (predicted vs
reached by the retrained model, golden labels), ``<stream>.predicted_retrain_s`` / ``<stream>.measured_retrain_s``
(the controller's predicted vs the measured retraining duration, slice seconds), ``<stream>.golden_label_accuracy``, the means;
tags ``policy``, ``window``, ``failed_retrains``; artifact ``events.json`` (allocations over time).
Each completed retraining is a version of the registered model ``<prefix>-<stream>`` with tags
``window``, ``config``, ``policy``, ``deployed``; the deployed one holds the alias ``champion``. Models are logged with
``serialization_format="pickle"`` (the loaded model is the nn.Module) and an explicit
``torch==2.13.0`` requirement (no requirement inference, no ``+cpu`` label), ENVIRONMENT.md §3.7, §4d.
"""

from __future__ import annotations

import json
import logging
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from gpu.state import state_dir
from tasks.report.charts import pyplot, save_png
from tasks.ekya.window import RunSettings, StreamRuntime, WindowResult
from tasks.runtime.tracking import holder_tags, open_client, register_model_version

CHAMPION = "champion"  # alias of the registered version each stream serves (``models:/<prefix>-<stream>@champion``)


class _DropPickleWarning(logging.Filter):
    """Drops mlflow.pytorch's one warning that pickle serialisation can run code on load: these models are
    ours, written and read by this project (pickle keeps the loaded model the same nn.Module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Saving pytorch model by Pickle or CloudPickle format")


@contextmanager
def _without_pickle_warning() -> Iterator[None]:
    logger, flt = logging.getLogger("mlflow.pytorch"), _DropPickleWarning()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


class WindowLogger:
    """Logs windows of one flow run; every method is a no-op when tracking is off (no parent run)."""

    def __init__(self, run: RunSettings, parent_run_id: str | None):
        self.run = run
        self.parent_run_id = parent_run_id
        self.client: Any = None
        self.experiment_id: str | None = None
        if parent_run_id is not None:
            self.client = open_client(run.tracking_uri)
            self.experiment_id = self.client.get_run(parent_run_id).info.experiment_id

    @classmethod
    def for_flow(cls, run: RunSettings, parent_run_id: str | None) -> "WindowLogger":
        return cls(run, parent_run_id)

    def log_window(self, result: WindowResult, streams: list[StreamRuntime]) -> str | None:
        """One nested run for the window, plus a registered model version per completed retraining."""
        if self.client is None:
            return None
        from mlflow.entities import Metric, Param, RunTag

        w, policy = result.window, self.run.policy
        run = self.client.create_run(self.experiment_id, run_name=f"{policy}-window-{w}", tags={
            "mlflow.parentRunId": self.parent_run_id, **holder_tags(), "policy": policy, "window": str(w),
            "failed_retrains": ",".join(result.failures) or "none"})
        rid = run.info.run_id
        jobs = {j.stream: j for j in result.jobs}
        params = [Param("pool_gpus", str(self.run.pool_gpus)), Param("window_s", str(self.run.window_s))]
        metrics: dict[str, float] = {"mean_measured_accuracy": result.mean_measured,
                                     "mean_predicted_accuracy": sum(result.predicted.values()) / len(result.predicted)}
        for s in streams:
            n = s.spec.name
            job = jobs.get(n)
            params += [Param(f"{n}.config", str(result.configs.get(n))),
                       Param(f"{n}.infer_gpus", f"{result.start_alloc.get(f'{n}/infer', 0.0):.2f}"),
                       Param(f"{n}.retrain_gpus", f"{job.gpus:.2f}" if job else "0"),
                       Param(f"{n}.retrain_state", job.outcome if job else "NONE"),
                       Param(f"{n}.deployed_version", s.version)]
            metrics |= {f"{n}.predicted_accuracy": result.predicted[n], f"{n}.measured_accuracy": result.measured[n],
                        f"{n}.golden_label_accuracy": result.profiles[n].golden_accuracy,
                        f"{n}.start_model_accuracy": result.profiles[n].current_accuracy}
            if job is not None:
                metrics[f"{n}.profiled_accuracy"] = job.predicted.accuracy
                metrics[f"{n}.predicted_retrain_s"] = job.expected_s
                if job.result is not None:
                    metrics[f"{n}.measured_retrain_s"] = job.result.slice_s
                if job.result is not None:
                    metrics[f"{n}.retrained_val_accuracy"] = job.result.val_accuracy
        self.client.log_batch(rid, metrics=[Metric(k, float(v), 0, w) for k, v in metrics.items()], params=params,
                              tags=[RunTag(f"{n}.failed", "true") for n in result.failures])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "events.json"
            path.write_text(json.dumps(result.events, indent=1))
            self.client.log_artifact(rid, str(path))
        self._register(rid, result, streams)
        self.client.set_terminated(rid, "FINISHED")
        return rid

    def _register(self, run_id: str, result: WindowResult, streams: list[StreamRuntime]) -> None:
        import mlflow
        import mlflow.pytorch

        from tasks.ekya.work import small_net

        done = [j for j in result.jobs if j.outcome == "COMPLETED" and j.result is not None]
        if not done:
            return
        mlflow.set_tracking_uri(self.run.tracking_uri)
        deployed = {s.spec.name: s.version for s in streams}
        with mlflow.start_run(run_id=run_id), _without_pickle_warning():
            for job in done:
                model = small_net(self.run.settings)
                model.load_state_dict(job.result.state)
                name = f"{self.run.registry_prefix}-{job.stream}"
                info = mlflow.pytorch.log_model(model.eval(), name=job.stream, serialization_format="pickle",
                                                pip_requirements=["torch==2.13.0"])
                version = register_model_version(self.client, name, info, run_id)
                tags = {"window": str(result.window), "config": job.config.name, "policy": self.run.policy,
                        "deployed": str(deployed[job.stream] == f"w{result.window}-{job.config.name}").lower(),
                        "val_accuracy": f"{job.result.val_accuracy:.4f}"}
                for k, v in tags.items():
                    self.client.set_model_version_tag(name, version, k, v)
                if tags["deployed"] == "true":  # the version serving the stream now: alias champion
                    self.client.set_registered_model_alias(name, CHAMPION, version)

    def log_plot(self, results: list[WindowResult]) -> str:
        """Accuracy over (slice) time per stream as a PNG in the state folder, logged to the flow's run."""
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
        if self.client is not None:
            self.client.log_artifact(self.parent_run_id, str(out))
        return str(out)
