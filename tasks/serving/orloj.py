"""ORLOJ in the serving rollout: the first histograms, one policy per worker, and the controller that re-profiles.

Before serving, each served model is timed alone on sampled test digits (thesis §4.3.2's profiling step,
``tasks.serving.dynamic_models.alone_times``); a session's requests are its model's, and the runtime queues
each session apart, so every session is one application (``mix="own_app"``). ``c0`` is the smallest intercept of
the models' measured profiles (Eq. 4.3); with one model, its measured profile also gives the batch growth
(``PaddedBatchModel.from_profile``).

The rollout's ``OrlojController`` holds the reference policy: every epoch its ``on_epoch`` re-profiles from the
batches the workers measured (``tasks.serving.epochs``), and each worker's policy — the running ones through
``update_policies``, new ones through the factory — follows its histograms.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.systems import make_batch_policy
from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.orloj.controller import OrlojController
from gpu.schedulers.orloj.profiler import OnlineProfiler

PROFILE_REQUESTS = 100  # test digits each model is timed alone on before ORLOJ serves it
MIN_SAMPLES = 10  # batches of an application in an epoch before its histogram is re-published


def orloj_controller(models: Mapping[str, Any], profiles: Mapping[str, BatchProfile], sessions: Sequence[Session],
                     rows: np.ndarray, epoch_s: float, seed: int = 0) -> OrlojController:
    """The rollout's ORLOJ controller: histograms of each model timed alone on ``rows``, an SLO per session, and
    a profiler whose window holds one epoch's measurements (§4.3.2 "resets its profiling memory")."""
    from tasks.serving.dynamic_models import alone_times

    served = sorted({s.model for s in sessions})
    by_model = {m: alone_times(models[m], {m: rows})[m] for m in served}
    hists = {s.session_id: by_model[s.model] for s in sessions}
    fits = [np.polyfit(profiles[m].batches, profiles[m].latency_ms, 1)[1] for m in served]
    c0 = max(0.0, min(min(fits), min(h.edges[0] for h in by_model.values())))
    if len(served) == 1 and c0 < profiles[served[0]].latency(1):
        batch = PaddedBatchModel.from_profile(profiles[served[0]].latency, profiles[served[0]].max_batch, c0)
    else:
        batch = PaddedBatchModel(c0)
    policy = make_batch_policy("orloj", histograms=hists, model=batch, mix="own_app")
    profiler = OnlineProfiler(window_ms=0.999 * epoch_s * 1000.0, min_samples=MIN_SAMPLES, bins=50, seed=seed)
    return OrlojController(policy, profiler=profiler, slo_ms={s.session_id: s.slo_ms for s in sessions})


def policy_factory(name: str, orloj: OrlojController | None) -> Callable[[], Any]:
    """One batch policy per worker; ORLOJ's copies start from the controller's histograms of the moment."""
    if orloj is None:
        return lambda: make_batch_policy(name)
    ref = orloj.batch_policy
    return lambda: make_batch_policy("orloj", histograms=ref.histograms, model=ref.model, mix=ref.mix)  # type: ignore
