"""The serving spec a rollout takes: models, sessions (rate, SLO), optional query DAGs, a rate trace.

Format (YAML or JSON; ``docs/serving.md``)::

    name: digits
    preset: paper                       # Nexus latency accounting
    sessions: [{id: mlp, model: digits_mlp, slo_ms: 10, rate: 300}]
    queries:  [{id: q, slo_ms: 30, rate: 50, stages: [{name: a, model: digits_cnn, parent: null},
                                                     {name: b, model: digits_mlp, parent: a, gamma: 2}]}]
    trace: {duration_s: 30, seed: 0, phases: [{at_s: 0, scale: 1}, {at_s: 10, scale: 3, rates: {mlp: 100}}]}
    epoch: {epoch_s: 10, min_epoch_s: 5, beacon_s: 1, avg_interval_s: 2}
    runtime: {batch_policy: early_drop, load_balancer: drr, training_steps: 300}

Queries are split into one session per stage (``query/stage``) by the DP of Nexus §6.2 once the models
are profiled. A query is served as a DAG (``tasks.serving.chaining``: the trace drives its root stage,
finished stage requests issue the next stage's — with the Ray backend, from the actor that ran them).
A phase's ``scale`` multiplies every base rate (sessions and queries); its ``rates`` set some absolutely.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Collection, Mapping

from gpu.batching import POLICIES
from gpu.errors import ConfigError
from gpu.scenario import choose, load_scenario, positive, require
from gpu.schedulers.nexus import Session
from gpu.schedulers.nexus_epoch import EpochConfig
from gpu.schedulers.nexus_profiles import PRESETS, BatchProfile
from gpu.schedulers.nexus_query import Query, QueryStage, profile_throughput, split_slo
from tasks.serving.frontend import LOAD_BALANCERS
from tasks.serving.loadgen import RatePhase, RateTrace
from tasks.serving.models import check_model

_TOP = {"name", "preset", "sessions", "queries", "trace", "epoch", "runtime"}
_RUNTIME = {"batch_policy", "load_balancer", "training_steps", "profile_repeats", "seed"}


@dataclass(frozen=True)
class ServingSpec:
    """A parsed serving spec; rates in requests/s, times in ms (SLOs) and s (trace, epochs)."""

    name: str
    sessions: tuple[Session, ...]
    queries: tuple[Query, ...] = ()
    phases: tuple[dict, ...] = ({"at_s": 0.0, "scale": 1.0},)
    duration_s: float = 30.0
    seed: int = 0
    preset: str = "paper"
    epoch: EpochConfig = field(default_factory=lambda: EpochConfig(10.0, 5.0, 1.0, 2.0))
    batch_policy: str = "early_drop"
    load_balancer: str = "drr"
    training_steps: int = 300
    profile_repeats: int = 10

    @property
    def models(self) -> list[str]:
        return sorted({s.model for s in self.sessions} | {st.model for q in self.queries for st in q.stages})

    def planned_sessions(self, profiles: Mapping[str, BatchProfile], epsilon_ms: float = 1.0) -> list[Session]:
        """Sessions plus one session per query stage with the DP's SLO split (needs the measured profiles)."""
        out = list(self.sessions)
        for q in self.queries:
            tput = {st.name: profile_throughput(profiles[st.model], self.preset) for st in q.stages}
            out += split_slo(q, tput, epsilon_ms).sessions(q)
        return out

    def chains(self) -> dict[str, tuple[str, float]]:
        """``{stage session: (parent stage session, γ)}`` for every non-root query stage."""
        return {f"{q.query_id}/{st.name}": (f"{q.query_id}/{st.parent}", st.gamma)
                for q in self.queries for st in q.stages if st.parent is not None}

    def trace(self, sessions: list[Session], issued: Collection[str] = ()) -> RateTrace:
        """The rate trace over the planned sessions (query scales and rates apply to their stages), less the
        ``issued`` ones: stages whose requests their parent stage issues (``chains()``, served as a DAG)."""
        stage_of = {f"{q.query_id}/{u}": (q, u) for q in self.queries for u in q.order()}
        base = {s.session_id: s.rate for s in sessions if s.session_id not in issued}
        phases = []
        for p in self.phases:
            rates = {sid: r * p["scale"] for sid, r in base.items()}
            for key, r in p["rates"].items():
                for sid in base:
                    q_u = stage_of.get(sid)
                    if sid == key:
                        rates[sid] = r
                    elif q_u and q_u[0].query_id == key:
                        rates[sid] = replace(q_u[0], rate=r).stage_rates()[q_u[1]]
            phases.append(RatePhase(p["at_s"], rates))
        return RateTrace(tuple(phases), self.duration_s)


def _phase(raw: Mapping[str, Any], i: int, ids: set[str]) -> dict:
    where = f"trace.phases[{i}]."
    for key in raw:
        if key not in ("at_s", "scale", "rates"):
            raise ConfigError(f"{where}{key}", raw[key], "unknown field; expected at_s, scale, rates")
    rates = dict(raw.get("rates") or {})
    for sid, r in rates.items():
        if sid not in ids:
            raise ConfigError(f"{where}rates", sid, f"unknown session or query; choose one of {sorted(ids)}")
        positive(r, f"{where}rates.{sid}", allow_zero=True)
    return {"at_s": positive(require(raw, "at_s", where), f"{where}at_s", allow_zero=True),
            "scale": positive(raw.get("scale", 1.0), f"{where}scale", allow_zero=True), "rates": rates}


def parse_spec(raw: Mapping[str, Any], name: str = "serving") -> ServingSpec:
    """Validate a spec mapping; every bad value raises one ConfigError naming its field."""
    for key in raw:
        if key not in _TOP:
            raise ConfigError(key, raw[key], f"unknown spec field; expected one of {sorted(_TOP)}")
    preset = choose(raw.get("preset", "paper"), "preset", list(PRESETS))
    sessions = []
    for i, s in enumerate(raw.get("sessions") or []):
        sid = str(require(s, "id", f"sessions[{i}]."))
        check_model(str(require(s, "model", f"sessions[{i}].")), f"{sid}.model")
        sessions.append(Session(sid, str(s["model"]), require(s, "slo_ms", f"sessions[{i}]."),
                                require(s, "rate", f"sessions[{i}].")))
    queries = []
    for i, q in enumerate(raw.get("queries") or []):
        qid = str(require(q, "id", f"queries[{i}]."))
        stages = []
        for j, st in enumerate(require(q, "stages", f"queries[{i}].")):
            stage = str(require(st, "name", f"queries[{i}].stages[{j}]."))
            check_model(str(require(st, "model", f"queries[{i}].stages[{j}].")), f"{qid}.{stage}.model")
            stages.append(QueryStage(stage, str(st["model"]), st.get("parent"), float(st.get("gamma", 1.0))))
        queries.append(Query(qid, tuple(stages), require(q, "slo_ms", f"queries[{i}]."),
                             require(q, "rate", f"queries[{i}].")))
    if not sessions and not queries:
        raise ConfigError("sessions", [], "a serving spec needs at least one session or query")
    ids = [s.session_id for s in sessions] + [q.query_id for q in queries]
    if len(set(ids)) != len(ids):
        raise ConfigError("sessions", ids, "session and query ids must be unique")
    trace = raw.get("trace") or {}
    for key in trace:
        if key not in ("duration_s", "seed", "phases"):
            raise ConfigError(f"trace.{key}", trace[key], "unknown field; expected duration_s, seed, phases")
    phases = tuple(_phase(p, i, set(ids)) for i, p in enumerate(trace.get("phases") or [{"at_s": 0}]))
    if phases[0]["at_s"] != 0:
        raise ConfigError("trace.phases[0].at_s", phases[0]["at_s"], "the first phase must start at 0")
    ep = raw.get("epoch") or {}
    try:
        epoch = EpochConfig(**{"epoch_s": 10.0, "min_epoch_s": 5.0, "beacon_s": 1.0, "avg_interval_s": 2.0, **ep})
    except TypeError as exc:
        raise ConfigError("epoch", dict(ep), f"unknown field ({exc})") from None
    rt = raw.get("runtime") or {}
    for key in rt:
        if key not in _RUNTIME:
            raise ConfigError(f"runtime.{key}", rt[key], f"unknown field; expected one of {sorted(_RUNTIME)}")
    return ServingSpec(
        name=str(raw.get("name", name)), sessions=tuple(sessions), queries=tuple(queries), phases=phases,
        duration_s=positive(trace.get("duration_s", 30.0), "trace.duration_s"), seed=int(trace.get("seed", 0)),
        preset=preset, epoch=epoch,
        batch_policy=choose(rt.get("batch_policy", "early_drop"), "runtime.batch_policy", list(POLICIES)),
        load_balancer=choose(rt.get("load_balancer", "drr"), "runtime.load_balancer", list(LOAD_BALANCERS)),
        training_steps=int(positive(rt.get("training_steps", 300), "runtime.training_steps")),
        profile_repeats=int(positive(rt.get("profile_repeats", 10), "runtime.profile_repeats")))


def load_spec(path: str) -> ServingSpec:
    """Parse a YAML/JSON serving spec file."""
    return parse_spec(load_scenario(path), name=str(path))


def check_slos(sessions: list[Session], profiles: Mapping[str, BatchProfile], preset: str) -> None:
    """Fail, naming the session, when an SLO is below what batch 1 of its model needs (2ℓ(1) under paper)."""
    acc = PRESETS[preset]
    for s in sessions:
        acc.max_batch(profiles[s.model], s.slo_ms, s.session_id)
