"""The serving spec a rollout takes: models, sessions (rate, SLO), optional query DAGs, a rate trace.

Format (YAML or JSON; ``docs/serving.md``)::

    name: digits
    preset: paper                       # Nexus latency accounting
    sessions: [{id: mlp, model: digits_mlp, slo_ms: 10, rate: 300}]
    #   a session several applications share (ORLOJ §4.3.2): apps: [{id: clean, share: 0.5},
    #                                                              {id: noisy, share: 0.5, noise: 0.3, slo_ms: 20}]
    queries:  [{id: q, slo_ms: 30, rate: 50, stages: [{name: a, model: digits_cnn, parent: null},
                                                     {name: b, model: digits_mlp, parent: a, gamma: 2}]}]
    trace: {duration_s: 30, seed: 0, phases: [{at_s: 0, scale: 1}, {at_s: 10, scale: 3, rates: {mlp: 100}}]}
    epoch: {epoch_s: 10, min_epoch_s: 5, beacon_s: 1, avg_interval_s: 2}
    runtime: {batch_policy: early_drop, load_balancer: drr, training_steps: 300}
    placement: {policy: nona, nodes: 2}  # nexus (default) | shares | nona | undistributed | opportunistic | random
    link: {mu: 2560000, bytes: 25600}     # emulated bottleneck link: bytes/s, bytes per hand-off

Queries are split into one session per stage (``query/stage``) by the DP of Nexus §6.2 once the models
are profiled. A query is served as a DAG (``tasks.serving.chaining``: the trace drives its root stage,
finished stage requests issue the next stage's — with the Ray backend, from the actor that ran them).
A phase's ``scale`` multiplies every base rate (sessions and queries); its ``rates`` set some absolutely.

Applications (``apps`` of a session): each sends ``share`` of the session's requests, its inputs corrupted with
Gaussian noise of std ``noise`` (digits in [0, 1]; a dynamic model exits later on them), under its own ``slo_ms``
when it has one. ORLOJ keeps one execution-time histogram per application (``tasks.serving.orloj``).

A stage may list several parents (``parents: [b, c]``): a join, run once per query after all of them
(``gpu.schedulers.nexus.chaining``). A query with a join runs each stage once per query (γ = 1) and, the §6.2
DP being for trees, gets the §7.2 even split: every stage ``slo_ms / (stages on its longest path)``.

Placement (``docs/serving.md``): ``nexus`` plans with squishy bin packing and routes by its shares; ``shares``
and ``nona`` host every stage on each of ``nodes`` nodes, ``shares`` routing each request by its session's
shares and ``nona`` each query by the placement it samples from θ (``tasks.serving.nona``); Nona's baselines
``undistributed``, ``opportunistic`` and ``random`` place queries on the same nodes by their rules. ``link``
emulates a bottleneck link between nodes (``tasks.serving.link``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Collection, Mapping

import numpy as np

from gpu.systems import BATCH_POLICIES, SYSTEMS
from gpu.errors import ConfigError
from gpu.scenario import (MAX_COUNT, MAX_FACTOR, MAX_FANOUT, MAX_MS, MAX_RATE, MAX_SECONDS, MAX_SEED, choose, entries, integer,
                          label, load_scenario, mapping, number, positive, require, section, within_events)
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.nexus.chaining import QueryChains
from gpu.schedulers.nexus.epoch import EpochConfig
from gpu.schedulers.nexus.profiles import PRESETS, BatchProfile
from gpu.schedulers.nexus.query import Query, QueryStage, profile_throughput, split_slo
from gpu.schedulers.nexus.routing import LOAD_BALANCERS
from tasks.serving.loadgen import RatePhase, RateTrace
from tasks.serving.models import check_model
from tasks.serving.nona import BASELINES

_TOP = {"name", "preset", "sessions", "queries", "trace", "epoch", "runtime", "placement", "link"}
_SESSION = {"id", "model", "slo_ms", "rate", "apps"}
_APP = {"id", "share", "noise", "slo_ms"}
_QUERY = {"id", "slo_ms", "rate", "stages"}
_STAGE = {"name", "model", "parent", "parents", "gamma"}
_PLACEMENT = {"policy", "nodes"}
PLACEMENTS = ("nexus", "shares", "nona", *BASELINES)
NONA_PLACEMENTS = ("nona", *BASELINES)  # Nona's placement and the baselines its paper compares it with


def serving_system(placement: str, batch_policy: str) -> str:
    """Which system a rollout runs, for its MLflow experiment and run name: Nona when Nona or one of its baselines
    places the queries, else the system that declares the workers' batch policy (ORLOJ's ``orloj``,
    ``clockwork``, ``clipper``; Nexus's ``early_drop``...), else Nexus."""
    if placement in NONA_PLACEMENTS:
        return "nona"
    owners = [name for name, entry in SYSTEMS.items() if batch_policy in entry.batch_policies]
    return owners[0] if owners else "nexus"
_LINK = {"mu", "bytes"}
MAX_NODES = 1_024  # nodes of a fixed placement: a lease each
MAX_LINK_BYTES_S = 1e13  # an emulated link of 80 Tb/s
MAX_HANDOFF_BYTES = 2.0**40  # a hand-off of 1 TiB
MAX_PROFILE_REPEATS = 1_000
_TRACE = {"duration_s", "seed", "phases"}
_PHASE = {"at_s", "scale", "rates"}
_RUNTIME = {"batch_policy", "load_balancer", "training_steps", "profile_repeats"}
# epoch fields and their defaults: EpochConfig's, its timers scaled down for short runs (docs/serving.md)
_EPOCH = {f.name: f.default for f in fields(EpochConfig)} | {"epoch_s": 10.0, "min_epoch_s": 5.0, "beacon_s": 1.0,
                                                              "avg_interval_s": 2.0}


@dataclass(frozen=True)
class AppSpec:
    """One application of a session: its share of the session's requests, input noise and own SLO (ms)."""

    app_id: str
    session_id: str
    share: float
    noise: float = 0.0
    slo_ms: float | None = None

    def inputs(self, rows: np.ndarray, seed: int = 0) -> np.ndarray:
        """The rows this application sends: ``rows`` with its noise, clipped to the digits' [0, 1]."""
        if not self.noise:
            return rows
        rng = np.random.default_rng([seed, sum(map(ord, self.app_id))])
        return np.clip(rows + rng.normal(0.0, self.noise, rows.shape), 0.0, 1.0).astype(np.float32)


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
    joins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "query/stage" -> all its parent stages
    placement: str = "nexus"
    nodes: int = 2
    link_mu: float | None = None
    handoff_bytes: float | None = None
    apps: tuple[AppSpec, ...] = ()

    @property
    def app_slos(self) -> dict[str, float | None]:
        """Application id → its own SLO (None: its session's), the runtime's ``apps``."""
        return {a.app_id: a.slo_ms for a in self.apps}

    def __post_init__(self) -> None:
        """The trace's length, and the arrivals it makes, are bounded however the spec was made (a parsed file, or a
        flow's ``duration_s`` override through ``dataclasses.replace``)."""
        positive(self.duration_s, "duration_s", upper=MAX_SECONDS)
        base = {s.session_id: s.rate for s in self.sessions} | {q.query_id: q.rate for q in self.queries}
        peak = max(sum(p.get("rates", {}).get(k, r * p.get("scale", 1.0)) for k, r in base.items())
                   for p in self.phases)
        within_events(peak * self.duration_s, "duration_s", self.duration_s,
                      "arrivals (the peak phase's rates x duration_s)")

    def stage_inputs(self, query: Query) -> dict[str, tuple[str, ...]]:
        """Stage → its parent stages (a join lists all of them) for every non-root stage of ``query``."""
        return {st.name: tuple(p.split("/", 1)[1] for p in self.joins[f"{query.query_id}/{st.name}"])
                if f"{query.query_id}/{st.name}" in self.joins else (st.parent,)
                for st in query.stages if st.parent is not None}

    def has_join(self, query: Query) -> bool:
        return any(k.split("/", 1)[0] == query.query_id for k in self.joins)

    @property
    def models(self) -> list[str]:
        return sorted({s.model for s in self.sessions} | {st.model for q in self.queries for st in q.stages})

    def planned_sessions(self, profiles: Mapping[str, BatchProfile], epsilon_ms: float = 1.0) -> list[Session]:
        """Sessions plus one session per query stage with the DP's SLO split (needs the measured profiles)."""
        out = list(self.sessions)
        for q in self.queries:
            if self.has_join(q):
                out += _even_dag_split(q, self.stage_inputs(q))
                continue
            tput = {st.name: profile_throughput(profiles[st.model], self.preset) for st in q.stages}
            out += split_slo(q, tput, epsilon_ms).sessions(q)
        return out

    def chains(self) -> dict[str, tuple[str, float]]:
        """``{stage session: (parent stage session, γ)}`` for every non-root query stage."""
        return {f"{q.query_id}/{st.name}": (self.joins.get(f"{q.query_id}/{st.name}", f"{q.query_id}/{st.parent}"),
                                            st.gamma)
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








def _even_dag_split(query: Query, inputs: Mapping[str, tuple[str, ...]]) -> list[Session]:
    """A DAG query's sessions: every stage at the root's rate, its budget the SLO over the longest path's
    stages (Nexus §7.2's even split; every path then fits the SLO)."""
    levels: dict[str, int] = {}

    def level(u: str) -> int:
        if u not in levels:
            levels[u] = 1 + max((level(p) for p in inputs.get(u, ())), default=0)
        return levels[u]

    share = query.slo_ms / max(level(st.name) for st in query.stages)
    return [Session(f"{query.query_id}/{st.name}", st.model, share, query.rate) for st in query.stages]


def _sessions(raw: list[dict[str, Any]]) -> tuple[list[Session], list[AppSpec]]:
    """``sessions: [{id, model, slo_ms, rate, apps}]``; types here, ranges in ``Session`` (named by its id)."""
    out, apps = [], []
    for i, s in enumerate(raw):
        where = f"sessions[{i}]."
        sid = label(require(s, "id", where), f"{where}id")
        model = check_model(label(require(s, "model", where), f"{where}model"), f"{sid}.model")
        out.append(Session(sid, model, number(require(s, "slo_ms", where), f"{where}slo_ms", upper=MAX_MS),
                           number(require(s, "rate", where), f"{where}rate", upper=MAX_RATE)))
        apps += _apps(s.get("apps"), sid, f"{where}apps")
    return out, apps


def _apps(raw: Any, sid: str, where: str) -> list[AppSpec]:
    """A session's ``apps: [{id, share, noise, slo_ms}]``: shares > 0 that sum to 1."""
    out = []
    for j, a in enumerate(entries(raw, where, _APP)):
        at = f"{where}[{j}]."
        slo = a.get("slo_ms")
        out.append(AppSpec(label(require(a, "id", at), f"{at}id"), sid,
                           positive(require(a, "share", at), f"{at}share", upper=1.0),
                           positive(a.get("noise", 0.0), f"{at}noise", allow_zero=True, upper=MAX_FACTOR),
                           None if slo is None else positive(slo, f"{at}slo_ms", upper=MAX_MS)))
    if out and abs(sum(a.share for a in out) - 1.0) > 1e-6:
        raise ConfigError(where, [a.share for a in out], "the applications' shares must sum to 1")
    return out


def _queries(raw: list[dict[str, Any]]) -> tuple[list[Query], dict[str, tuple[str, ...]]]:
    """``queries: [{id, slo_ms, rate, stages: [{name, model, parent, gamma}]}]``; types here, the tree and
    the ranges in ``Query``."""
    out, joins = [], {}
    for i, q in enumerate(raw):
        where = f"queries[{i}]."
        qid = label(require(q, "id", where), f"{where}id")
        stages = []
        for j, st in enumerate(entries(require(q, "stages", where), f"{where}stages", _STAGE)):
            at = f"{where}stages[{j}]."
            name = label(require(st, "name", at), f"{at}name")
            parent = st.get("parent")
            if "parents" in st:
                if parent is not None:
                    raise ConfigError(f"{at}parents", st["parents"], "give parent or parents, not both")
                raw_parents = st["parents"]
                if not isinstance(raw_parents, (list, tuple)):
                    raise ConfigError(f"{at}parents", raw_parents, "must be a list of stage names")
                many = [label(p, f"{at}parents") for p in raw_parents]
                if len(many) < 2 or len(set(many)) != len(many):
                    raise ConfigError(f"{at}parents", raw_parents, "a join needs two or more distinct parents")
                parent = many[0]
                joins[f"{qid}/{name}"] = tuple(f"{qid}/{p}" for p in many)
            stages.append(QueryStage(name, check_model(label(require(st, "model", at), f"{at}model"),
                                                       f"{qid}.{name}.model"),
                                     None if parent is None else label(parent, f"{at}parent"),
                                     number(st.get("gamma", 1.0), f"{at}gamma", upper=MAX_FANOUT)))
        out.append(Query(qid, tuple(stages), number(require(q, "slo_ms", where), f"{where}slo_ms", upper=MAX_MS),
                         number(require(q, "rate", where), f"{where}rate", upper=MAX_RATE)))
        names = {st.name for st in stages}
        for child, parents in joins.items():
            for p in parents:
                if child.startswith(f"{qid}/") and p.split("/", 1)[1] not in names:
                    raise ConfigError(f"{child}.parents", p.split("/", 1)[1], "no such stage")
    return out, joins


def _phases(raw: Any, ids: set[str]) -> tuple[dict, ...]:
    """``trace.phases: [{at_s, scale, rates: {id: req/s}}]``, the first at 0 s, then strictly later."""
    phases = []
    for i, p in enumerate(entries(raw, "trace.phases", _PHASE) or [{"at_s": 0}]):
        where = f"trace.phases[{i}]."
        rates = mapping(p.get("rates"), f"{where}rates")
        for sid, r in rates.items():
            if sid not in ids:
                raise ConfigError(f"{where}rates", sid, f"unknown session or query; choose one of {sorted(ids)}")
            positive(r, f"{where}rates.{sid}", allow_zero=True, upper=MAX_RATE)
        at_s = positive(require(p, "at_s", where), f"{where}at_s", allow_zero=True, upper=MAX_SECONDS)
        if i == 0 and at_s != 0:
            raise ConfigError(f"{where}at_s", p["at_s"], "the first phase must start at 0")
        if i > 0 and at_s <= phases[-1]["at_s"]:
            raise ConfigError(f"{where}at_s", p["at_s"], f"must be after the previous phase's {phases[-1]['at_s']:g} s")
        phases.append({"at_s": at_s, "scale": positive(p.get("scale", 1.0), f"{where}scale", allow_zero=True,
                                                       upper=MAX_FANOUT),
                       "rates": rates})
    return tuple(phases)


def _epoch(raw: Any) -> EpochConfig:
    """``epoch: {epoch_s, min_epoch_s, beacon_s, avg_interval_s, low, high, shrink}`` (seconds, fractions)."""
    ep = section(raw, "epoch", _EPOCH)
    values = {k: positive(ep.get(k, default), f"epoch.{k}", upper=MAX_SECONDS if k.endswith("_s") else MAX_FANOUT)
              for k, default in _EPOCH.items()}
    if values["min_epoch_s"] > values["epoch_s"]:
        raise ConfigError("epoch.min_epoch_s", ep["min_epoch_s"], f"must be <= epoch_s={values['epoch_s']:g}")
    return EpochConfig(**values)


def parse_spec(raw: Mapping[str, Any], name: str = "serving") -> ServingSpec:
    """Validate a spec mapping; every bad value raises one ConfigError naming its field."""
    for key in raw:
        if key not in _TOP:
            raise ConfigError(key, raw[key], f"unknown spec field; expected one of {sorted(_TOP)}")
    preset = choose(raw.get("preset", "paper"), "preset", list(PRESETS))
    sessions, apps = _sessions(entries(raw.get("sessions"), "sessions", _SESSION))
    queries, joins = _queries(entries(raw.get("queries"), "queries", _QUERY))
    if not sessions and not queries:
        raise ConfigError("sessions", [], "a serving spec needs at least one session or query")
    ids = [s.session_id for s in sessions] + [q.query_id for q in queries]
    if len(set(ids)) != len(ids):
        raise ConfigError("sessions", ids, "session and query ids must be unique")
    app_ids = [a.app_id for a in apps]
    if len(set(app_ids)) != len(app_ids) or set(app_ids) & set(ids):
        raise ConfigError("sessions.apps", app_ids, "application ids must be unique and differ from session ids")
    trace = section(raw.get("trace"), "trace", _TRACE)
    phases = _phases(trace.get("phases"), set(ids))
    epoch = _epoch(raw.get("epoch"))
    rt = section(raw.get("runtime"), "runtime", _RUNTIME)
    place = section(raw.get("placement"), "placement", _PLACEMENT)
    link = section(raw.get("link"), "link", _LINK)
    duration_s = positive(trace.get("duration_s", 30.0), "trace.duration_s", upper=MAX_SECONDS)
    spec = ServingSpec(
        name=label(raw.get("name", name), "name"), sessions=tuple(sessions), queries=tuple(queries), phases=phases,
        duration_s=duration_s,
        seed=integer(trace.get("seed", 0), "trace.seed", minimum=0, maximum=MAX_SEED), preset=preset, epoch=epoch,
        batch_policy=choose(rt.get("batch_policy", "early_drop"), "runtime.batch_policy", list(BATCH_POLICIES)),
        load_balancer=choose(rt.get("load_balancer", "drr"), "runtime.load_balancer", list(LOAD_BALANCERS)),
        training_steps=integer(rt.get("training_steps", 300), "runtime.training_steps", minimum=1, maximum=MAX_COUNT),
        profile_repeats=integer(rt.get("profile_repeats", 10), "runtime.profile_repeats", minimum=1,
                                maximum=MAX_PROFILE_REPEATS),
        joins=joins, placement=choose(place.get("policy", "nexus"), "placement.policy", list(PLACEMENTS)),
        nodes=integer(place.get("nodes", 2), "placement.nodes", minimum=1, maximum=MAX_NODES),
        link_mu=positive(link["mu"], "link.mu", upper=MAX_LINK_BYTES_S) if "mu" in link else None,
        handoff_bytes=positive(link["bytes"], "link.bytes", upper=MAX_HANDOFF_BYTES) if "bytes" in link else None,
        apps=tuple(apps))
    QueryChains(spec.chains())  # joins' γ, parents of one query, no cycles: checked before anything runs
    return spec


def load_spec(path: str) -> ServingSpec:
    """Parse a YAML/JSON serving spec file."""
    return parse_spec(load_scenario(path), name=str(path))


def check_slos(sessions: list[Session], profiles: Mapping[str, BatchProfile], preset: str) -> None:
    """Fail, naming the session, when an SLO is below what batch 1 of its model needs (2ℓ(1) under paper)."""
    acc = PRESETS[preset]
    for s in sessions:
        acc.max_batch(profiles[s.model], s.slo_ms, s.session_id)
