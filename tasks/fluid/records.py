"""MLflow records of the FLUID TrialGroups flow: FLUID's measured parameters on the flow's run, a child run per trial.

Under the flow's run (the GPU task runner opens it): params ``fluid.c``/``d``/``alpha``/``beta`` and where each came
from, the packing curve (Eq. 3.1, metrics by level p) and the scaling curve (metrics by width); one child run per
trial with its config, budget and profiled ``iter_time_s``, per-iteration loss/accuracy and per-chunk placement.
No-ops when tracking is off.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from tasks.fluid.profiling import Calibration
from tasks.runtime.tracking import register_model_version

log = logging.getLogger(__name__)


def _kept_going(method: Callable) -> Callable:
    """A failing tracking store costs the review, not the search: the error is kept for the flow's
    ``mlflow_errors`` and logged, and the trial goes on. A no-op when tracking is off."""
    @functools.wraps(method)
    def guarded(self: "TrialLog", *args: Any, **kwargs: Any) -> Any:
        if self.client is None:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            self.errors.append(f"{method.__name__} not logged to MLflow: {exc!r}")
            log.error(self.errors[-1])
            return None
    return guarded


def best_result(results: list[Any], failed: Any) -> Any:
    """The search's best trial: the lowest score among the trials that trained the most iterations (a trial
    stopped early by successive halving scored on fewer epochs is not comparable). RuntimeError when every
    trial in ``failed`` (ids) failed."""
    ok = [r for r in results if r.trial_id not in failed]
    if not ok:
        raise RuntimeError(f"every trial failed: {sorted(failed)}")
    top = max(r.iterations for r in ok)
    return min((r for r in ok if r.iterations == top), key=lambda r: r.score)


class TrialLog:
    """A child MLflow run per trial under the flow's run (no-op when tracking is off)."""

    def __init__(self, parent: str | None, tracking_uri: str):
        self.parent, self.runs, self.client, self.exp = parent, {}, None, None
        self.errors: list[str] = []
        if parent is not None:
            from mlflow import MlflowClient

            self.client = MlflowClient(tracking_uri)
            self.exp = self.client.get_run(parent).info.experiment_id
        self.tracking_uri = tracking_uri

    @_kept_going
    def open(self, trial, algorithm: str, execution: str) -> None:
        from mlflow.entities import Param

        run = self.client.create_run(self.exp, run_name=f"trial-{trial.trial_id}", tags={
            "mlflow.parentRunId": self.parent, "trial_id": trial.trial_id, "trial": trial.trial_id, "algorithm": algorithm,
            "execution": execution, "checkpoint_from": trial.checkpoint or "none"})
        params = [Param(k, str(v)) for k, v in trial.config.items()]
        params += [Param("budget", str(trial.budget)), Param("resume_from", str(trial.resume_from)),
                   Param("iter_time_s", f"{trial.iter_time_s:.6g}")]
        self.client.log_batch(run.info.run_id, params=params)
        self.runs[trial.trial_id] = run.info.run_id

    @_kept_going
    def chunk(self, out: dict[str, Any], step0: int) -> None:
        from mlflow.entities import Metric, RunTag

        rid = self.runs[out["trial_id"]]
        metrics = [Metric("width", float(out["width"]), 0, step0), Metric("gpu_fraction", out["fraction"], 0, step0),
                   Metric("data_parallel_devices", out["data_parallel"], 0, step0)]
        for i, (loss, acc) in enumerate(zip(out["loss"], out["val_accuracy"])):
            metrics += [Metric("loss", loss, 0, step0 + i + 1), Metric("val_accuracy", acc, 0, step0 + i + 1)]
        devices = ",".join(map(str, out["devices"]))
        tags = [RunTag("devices", devices), RunTag("width", f"{out['width']:.3f}"), RunTag("execution_note", out["note"]),
                RunTag(f"placement.{step0:04d}", f"node={out['node']} devices={devices} fraction={out['fraction']:g} "
                                                 f"width={out['width']:g} data_parallel={out['data_parallel']}")]
        self.client.log_batch(rid, metrics=metrics, tags=tags)

    @_kept_going
    def close(self, trial_id: str, ok: bool, error: str | None = None) -> None:
        if error:
            self.client.set_tag(self.runs[trial_id], "error", error[:500])
        self.client.set_terminated(self.runs[trial_id], "FINISHED" if ok else "FAILED")

    @_kept_going
    def register(self, trial_id: str, model, name: str) -> str | None:
        import mlflow
        import mlflow.pytorch

        mlflow.set_tracking_uri(self.tracking_uri)
        with mlflow.start_run(run_id=self.runs[trial_id]):
            info = mlflow.pytorch.log_model(model, name="model", serialization_format="pickle",
                                            pip_requirements=["torch==2.13.0"])
        version = register_model_version(self.client, name, info, self.runs[trial_id])
        self.client.set_terminated(self.runs[trial_id], "FINISHED")
        return version

    @_kept_going
    def search(self, cal: Calibration) -> None:
        """FLUID's parameters on the parent run, and the packing (metrics by p) and scaling (by width) curves
        they came from."""
        from mlflow.entities import Metric, Param

        params = [Param("fluid.c", str(cal.c)), Param("fluid.d", str(cal.d)), Param("fluid.alpha", f"{cal.alpha:.4g}"),
                  Param("fluid.beta", f"{cal.beta:.4g}"), Param("fluid.c_source", cal.c_source[:500]),
                  Param("fluid.d_source", cal.d_source[:500])]
        metrics = [Metric("calibration_s", cal.seconds, 0, 0)]
        if cal.scaling is not None:
            metrics += [Metric("scaling_iter_s", h, 0, w) for w, h in zip(cal.scaling.widths, cal.scaling.iter_times)]
        curve = cal.curve
        if curve is not None:
            params.append(Param("packing.o_th", str(curve.o_th)))
            metrics += [Metric("packing_alpha", curve.alpha, 0, 0), Metric("packing_c", curve.c, 0, 0),
                       Metric("packing_t1_s", curve.t1, 0, 0)]
            metrics += [Metric("packing_iters_per_s", x, 0, p) for p, x in zip(curve.ps, curve.throughputs)]
            metrics += [Metric("packing_marginal_benefit", o, 0, p)
                        for p, o in zip(curve.ps[1:], curve.marginal_benefit)]
        self.client.log_batch(self.parent, metrics=metrics, params=params)
