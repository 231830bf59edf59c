"""ORLOJ in the serving rollout: the first histograms, one policy per worker, and the controller that re-profiles.

Before serving, each application is timed alone on sampled test digits as it sends them (thesis §4.3.2's
profiling step, ``tasks.serving.dynamic_models.alone_times``): a session's ``apps`` (the spec's, e.g. clean and
noisy digits sharing one model) each get a histogram; a session without applications is one. With one served model
every application's histogram enters each batch's latency (``mix="round_robin"``, §4.4.3 "all execution time
distributions associated with the model"); with several models a request's own application's does
(``own_app``: the mixture would blend models). The batch cost (``batch_model``): a dynamic model's is measured
per batch size *and* depth before serving (``tasks.serving.batch_costs.depth_profile``, the recipe the simulator's
table follows: a profile on random inputs mixes how deep they run into how large the batch is, and made a batch
of two look 3.7× a request's work where it is 1.0×); otherwise ``c0`` is the smallest intercept of the models'
measured profiles (Eq. 4.3) and, with one model, its measured profile gives the growth
(``PaddedBatchModel.from_profile``).

Every worker decides through an ``OrlojController`` per session (``tasks.serving.worker``). The rollout's own
``OrlojController`` holds the reference policy: every epoch its ``on_epoch`` re-profiles from the batches the
workers measured (``tasks.serving.epochs``), and each worker's policy — the running ones through
``update_policies``, local or in a Ray actor, new ones through the factory — follows its histograms.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from gpu.schedulers.orloj.cost_model import PaddedBatchModel
from gpu.systems import make_batch_policy
from gpu.schedulers.nexus.profiles import BatchProfile
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.orloj.controller import OrlojController
from gpu.schedulers.orloj.policy import Histogram
from gpu.schedulers.orloj.profiler import OnlineProfiler
from tasks.serving.batch_costs import NETWORKS, depth_profile
from tasks.serving.dynamic_models import alone_times
from tasks.serving.spec import AppSpec, ServingSpec

PROFILE_REQUESTS = 100  # test digits each model is timed alone on before ORLOJ serves it
MIN_SAMPLES = 10  # batches of an application in an epoch before its histogram is re-published


def orloj_controller(models: Mapping[str, Any], profiles: Mapping[str, BatchProfile], sessions: Sequence[Session],
                     apps: Sequence[AppSpec], rows: np.ndarray, epoch_s: float, seed: int = 0) -> OrlojController:
    """The rollout's ORLOJ controller: each application timed alone on ``rows`` as it sends them (a session
    without applications: its model on ``rows``), an SLO per application, and a profiler whose window holds one
    epoch's measurements (§4.3.2 "resets its profiling memory")."""
    served = sorted({s.model for s in sessions})
    by_model: dict[str, Any] = {}  # a model timed once for all its sessions without applications
    hists, slo = {}, {}
    for s in sessions:
        own = [a for a in apps if a.session_id == s.session_id]
        for a in own:
            hists[a.app_id] = alone_times(models[s.model], {a.app_id: a.inputs(rows, seed)})[a.app_id]
            slo[a.app_id] = a.slo_ms or s.slo_ms
        if not own:
            if s.model not in by_model:
                by_model[s.model] = alone_times(models[s.model], {s.model: rows})[s.model]
            hists[s.session_id], slo[s.session_id] = by_model[s.model], s.slo_ms
    batch = batch_model({m: profiles[m] for m in served}, hists)
    mix = "round_robin" if len(served) == 1 else "own_app"
    policy = make_batch_policy("orloj", histograms=hists, model=batch, mix=mix)
    profiler = OnlineProfiler(window_ms=0.999 * epoch_s * 1000.0, min_samples=MIN_SAMPLES, bins=50, seed=seed)
    return OrlojController(policy, profiler=profiler, slo_ms=slo)


def batch_model(profiles: Mapping[str, BatchProfile], hists: Mapping[str, Histogram]) -> PaddedBatchModel:
    """ORLOJ's batch cost for the served models (module docstring): one dynamic model's, measured per batch size
    and depth with the applications' P99 alone time at its full depth; else Eq. 4.3 from the profiles."""
    served = sorted(profiles)
    if len(served) == 1 and served[0] in NETWORKS:
        return depth_profile(served[0]).model(max(h.quantile(0.99) for h in hists.values()))
    fits = [np.polyfit(profiles[m].batches, profiles[m].latency_ms, 1)[1] for m in served]
    c0 = max(0.0, min(min(fits), min(h.edges[0] for h in hists.values())))
    if len(served) == 1 and c0 < profiles[served[0]].latency(1):
        return PaddedBatchModel.from_profile(profiles[served[0]].latency, profiles[served[0]].max_batch, c0)
    return PaddedBatchModel(c0)


def app_inputs(spec: ServingSpec, rows: np.ndarray) -> dict[str, list[tuple[str, float, np.ndarray]]]:
    """Per session with applications, each one's ``(id, share, inputs)`` for the load generator."""
    out: dict[str, list[tuple[str, float, np.ndarray]]] = {}
    for a in spec.apps:
        out.setdefault(a.session_id, []).append((a.app_id, a.share, a.inputs(rows, spec.seed)))
    return out


def policy_factory(name: str, orloj: OrlojController | None) -> Callable[[], Any]:
    """One batch policy per worker; ORLOJ's copies start from the controller's histograms of the moment."""
    if orloj is None:
        return lambda: make_batch_policy(name)
    ref = orloj.batch_policy
    return lambda: make_batch_policy("orloj", histograms=ref.histograms, model=ref.model, mix=ref.mix)  # type: ignore
