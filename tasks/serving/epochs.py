"""The rollout's measured feedback every epoch: ORLOJ re-profiles and Nona re-solves from what the workers ran.

The serving rollout calls :meth:`EpochFeedback.on_beacon` every beacon with the arrivals the frontend counted.
Every ``epoch_s`` of trace it takes the batches the workers measured since the last epoch
(``LocalServingRuntime.take_batches``: per session, each batch's size and forward time) and hands them to the
controllers, through the hooks the simulators call:

* ORLOJ (thesis §4.3.2): ``OrlojController.on_epoch`` turns every batch into its longest alone time (Eq. 4.3),
  publishes the epoch's histograms, and the rollout pushes them to every running worker's policy
  (``LocalServingRuntime.update_policies``, between two batches); workers started later take them from the
  controller's policy.
* Nona (§III-A, §IV-D): ``MeasuredNona.on_epoch`` gives ``NonaController.on_epoch`` each class's measured
  arrival rate and each stage's measured service time, re-solving θ when they moved beyond ±40 %; the
  frontend's routing samples from the new θ from the next query on.

Each epoch's decisions are kept as rows (``orloj_epochs``, ``nona_epochs``) for the result and MLflow.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from gpu.schedulers.orloj.controller import OrlojController, Reprofiled
from tasks.serving.nona import MeasuredNona


@dataclass
class EpochFeedback:
    """Collects arrivals per beacon and, every ``epoch_s``, feeds the epoch's measurements to the controllers.

    Args:
        epoch_s: seconds of trace per epoch.
        take_batches: the runtime's ``take_batches``.
        update_policies: the runtime's ``update_policies`` (ORLOJ's histograms reach the running workers).
        orloj: ORLOJ's controller, when the workers batch with ORLOJ.
        nona: Nona's measured re-solving, when queries are placed by Nona.
    """

    epoch_s: float
    take_batches: Callable[[], Mapping[str, list[tuple[int, float]]]]
    update_policies: Callable[[Callable[[Any], None]], None]
    orloj: OrlojController | None = None
    nona: MeasuredNona | None = None
    orloj_epochs: list[dict[str, Any]] = field(default_factory=list)
    nona_epochs: list[dict[str, Any]] = field(default_factory=list)
    _arrivals: dict[str, int] = field(default_factory=dict)
    _since_s: float = 0.0

    @property
    def active(self) -> bool:
        return self.orloj is not None or self.nona is not None

    def on_beacon(self, t_s: float, counts: Mapping[str, int]) -> None:
        """Add a beacon's arrivals; at an epoch boundary, run the epoch's feedback."""
        for sid, n in counts.items():
            self._arrivals[sid] = self._arrivals.get(sid, 0) + n
        if self.active and t_s - self._since_s >= self.epoch_s - 1e-9:
            self.epoch(t_s)

    def epoch(self, t_s: float) -> None:
        """One epoch's feedback from the batches measured and the arrivals counted since the last."""
        batches = self.take_batches()
        span, arrivals = t_s - self._since_s, self._arrivals
        self._since_s, self._arrivals = t_s, {}
        if self.orloj is not None:
            decision = self.orloj.on_epoch(t_s * 1000.0, batches)
            if decision.histograms:
                self.update_policies(_adopt(decision))
            self.orloj_epochs.append(_orloj_row(t_s, decision, batches))
        if self.nona is not None and span > 0:
            self.nona_epochs.append(asdict(self.nona.on_epoch(t_s, arrivals, span, batches)))


def _adopt(decision: Reprofiled) -> Callable[[Any], None]:
    new = dict(decision.histograms)
    return lambda policy: policy.update_histograms({**policy.histograms, **new})


def _orloj_row(t_s: float, decision: Reprofiled, batches: Mapping[str, list[tuple[int, float]]]) -> dict[str, Any]:
    """Per application: its batches measured this epoch, the published histogram's mean and P99 alone time,
    and the largest batch ORLOJ now forms for it."""
    hists = dict(decision.histograms)
    apps = {}
    for app, limit in decision.batch_limits:
        h = hists.get(app)
        apps[app] = {"batches": len(batches.get(app, ())), "batch_limit": limit,
                     "reprofiled": h is not None, "mean_alone_ms": h.mean if h else None,
                     "p99_alone_ms": h.quantile(0.99) if h else None}
    return {"t_s": t_s, "apps": apps}


def feedback_series(orloj_epochs: list[dict[str, Any]], nona_epochs: list[dict[str, Any]],
                    queries: Mapping[str, Mapping[str, float]]) -> list[tuple[str, float, int]]:
    """``(metric, value, step)`` for MLflow: per epoch (step = second of trace) ORLOJ's batch limit and mean
    alone time per application and Nona's measured rate and re-solves per class; per query its JCT figures."""
    out: list[tuple[str, float, int]] = []
    for e in orloj_epochs:
        step = int(round(e["t_s"]))
        for app, row in e["apps"].items():
            out.append((f"series_orloj_batch_limit_{app}", float(row["batch_limit"]), step))
            if row["mean_alone_ms"] is not None:
                out.append((f"series_orloj_mean_alone_ms_{app}", float(row["mean_alone_ms"]), step))
    for e in nona_epochs:
        step = int(round(e["t_s"]))
        out += [(f"series_nona_rate_{k}", float(r), step) for k, r in e["rates"].items()]
        out.append(("series_nona_resolved", float(e["resolved"]), step))
    for q, figures in queries.items():
        out += [(f"query_{q}_{k}", float(v), 0) for k, v in figures.items()]
    return out
