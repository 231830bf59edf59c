"""FLUID's records of the TrialGroups flow: FLUID's measured parameters on the flow's run, a child run per trial, the
best trial's model in the Model Registry and the Prefect table ``fluid-trials-<algorithm>``. Published through
``tasks.report.records``.

Under the flow's run (the GPU task runner opens it): params ``fluid.c``/``d``/``alpha``/``beta`` and where each came
from, the packing curve (Eq. 3.1, metrics by level p) and the scaling curve (metrics by width); one child run per
trial with its config, budget and profiled ``iter_time_s``, per-iteration loss/accuracy and per-chunk placement.
No-ops when tracking is off; a failing store costs the review, not the search (``TrialLog.errors``).
"""

from __future__ import annotations

from typing import Any

from tasks.fluid.profiling import Calibration
from tasks.report.records import Records


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
        self.records = Records(tracking_uri, parent)
        self.runs: dict[str, str] = {}

    @property
    def parent(self) -> str | None:
        return self.records.parent

    @property
    def errors(self) -> list[str]:
        return self.records.errors

    def open(self, trial, algorithm: str, execution: str) -> None:
        with self.records.kept("open not logged to MLflow"):
            run = self.records.nested(f"trial-{trial.trial_id}", {
                "trial_id": trial.trial_id, "trial": trial.trial_id, "algorithm": algorithm, "execution": execution,
                "checkpoint_from": trial.checkpoint or "none"})
            if run is not None:
                self.records.log(run, params={**trial.config, "budget": trial.budget,
                                              "resume_from": trial.resume_from,
                                              "iter_time_s": f"{trial.iter_time_s:.6g}"})
                self.runs[trial.trial_id] = run

    def chunk(self, out: dict[str, Any], step0: int) -> None:
        if out["trial_id"] not in self.runs:
            return
        devices = ",".join(map(str, out["devices"]))
        with self.records.kept("chunk not logged to MLflow"):
            self.records.log(self.runs[out["trial_id"]], step=step0, metrics={
                "width": out["width"], "gpu_fraction": out["fraction"], "data_parallel_devices": out["data_parallel"]},
                series=[point for i, (loss, acc) in enumerate(zip(out["loss"], out["val_accuracy"]))
                        for point in (("loss", loss, step0 + i + 1), ("val_accuracy", acc, step0 + i + 1))],
                tags={"devices": devices, "width": f"{out['width']:.3f}", "execution_note": out["note"],
                      f"placement.{step0:04d}": f"node={out['node']} devices={devices} fraction={out['fraction']:g} "
                                                f"width={out['width']:g} data_parallel={out['data_parallel']}"})

    def close(self, trial_id: str, ok: bool, error: str | None = None) -> None:
        if trial_id not in self.runs:
            return
        with self.records.kept("close not logged to MLflow"):
            if error:
                self.records.log(self.runs[trial_id], tags={"error": error[:500]})
            self.records.finish(self.runs[trial_id], "FINISHED" if ok else "FAILED")

    def register(self, trial_id: str, model, name: str) -> str | None:
        if trial_id not in self.runs:
            return None
        with self.records.kept("register not logged to MLflow"):
            version = self.records.model(self.runs[trial_id], model, "model", name)
            self.records.finish(self.runs[trial_id])
            return version
        return None

    def search(self, cal: Calibration) -> None:
        """FLUID's parameters on the parent run, and the packing (metrics by p) and scaling (by width) curves
        they came from."""
        params = {"fluid.c": cal.c, "fluid.d": cal.d, "fluid.alpha": f"{cal.alpha:.4g}",
                  "fluid.beta": f"{cal.beta:.4g}", "fluid.c_source": cal.c_source[:500],
                  "fluid.d_source": cal.d_source[:500]}
        metrics = {"calibration_s": cal.seconds}
        series: list[tuple[str, float, int]] = []
        if cal.scaling is not None:
            series += [("scaling_iter_s", h, w) for w, h in zip(cal.scaling.widths, cal.scaling.iter_times)]
        curve = cal.curve
        if curve is not None:
            params["packing.o_th"] = curve.o_th
            metrics |= {"packing_alpha": curve.alpha, "packing_c": curve.c, "packing_t1_s": curve.t1}
            series += [("packing_iters_per_s", x, p) for p, x in zip(curve.ps, curve.throughputs)]
            series += [("packing_marginal_benefit", o, p) for p, o in zip(curve.ps[1:], curve.marginal_benefit)]
        with self.records.kept("search not logged to MLflow"):
            self.records.log(params=params, metrics=metrics, series=series)

    def table(self, algorithm: str, rows: list[dict[str, Any]], description: str) -> None:
        """The Prefect table ``fluid-trials-<algorithm>`` (one row per trial), also as JSON in the flow's run."""
        self.records.table(f"fluid-trials-{algorithm}", rows, description)
