"""``gpuflows simulate nexus``: plan a scenario's sessions and queries, then simulate every policy on it.

A *policy* here is a whole serving configuration from the paper's evaluation (§7), one of
``gpu.schedulers.nexus.policies.POLICIES``: ``nexus`` is the full system, the others its ablations and the
Clipper/TF-Serving-like baselines of §7.2. Scenario format: ``docs/nexus.md``.

CPU model (§6.3, §7.3.1; inferred, docs/nexus.md): a model may declare ``preprocess_ms`` per request. With OL
the node's CPU pool pre-processes requests as they arrive, in parallel with the GPU, and is assumed to keep up
(the paper provisions 4–5 cores per GPU "to saturate GPU throughput"): a request joins a batch ``p`` ms after it
arrives, its deadline unchanged, so the planner plans the GPU with ``SLO − p`` (what the authors' code does with
pre/post-processing) and the engine delays each request by ``p`` (``ready_ms``). Without OL a
GPU worker pre-processes a batch before its forward, by default on one thread: the planner and the engine both
use ``ℓ'(b) = b·p + ℓ(b)`` (``serial_preprocess``; ``preprocess_threads: k`` spreads it, ``⌈b/k⌉·p``). Both are transforms of the sessions and profiles the planner
and the engine already consume (``scaled_sessions``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from gpu.systems import make_batch_policy
from gpu.errors import ConfigError
from gpu.report import SimulationReport
from gpu.scenario import (MAX_BATCH, MAX_COUNT, MAX_FANOUT, MAX_GPUS, MAX_MB, MAX_MS, MAX_RATE, MAX_SECONDS,
                          MAX_SEED, choose, entries, flag, integer, label, load_scenario, mapping, names, number,
                          positive, require, section, within_events)
from gpu.schedulers.nexus.squishy import Plan, Session, SquishyPacker, batch_oblivious_plan, gpu_lower_bound
from gpu.schedulers.nexus.overflow import route_unassigned
from gpu.schedulers.nexus.prefix import PrefixGroup, merge_sessions, variant_profiles
from gpu.schedulers.nexus.profiles import (PRESETS, BatchProfile, linear_profile, published_profiles,
                                           serial_preprocess, table_profile)
from gpu.schedulers.nexus.policies import POLICIES, Strategy
from gpu.schedulers.nexus.synthetic import MIB, synthetic_profiles
from gpu.schedulers.nexus.query import (Query, QueryStage, Throughput, even_split, profile_throughput,
                                        split_slo)
from gpu.sim.nexus.engine import SimResult, simulate_plan


@dataclass(frozen=True)
class NexusScenario:
    """A parsed scenario (see ``docs/nexus.md``); times in ms, rates in requests/s."""

    name: str
    preset: str
    profiles: dict[str, BatchProfile]
    sessions: tuple[Session, ...]
    queries: tuple[Query, ...]
    gpus: int | None = None
    duration_s: float = 20.0
    arrivals: str = "poisson"
    seed: int = 0
    noise: bool = False
    epsilon_ms: float = 1.0
    prefix_groups: tuple[PrefixGroup, ...] = ()
    streams: dict[str, int] = field(default_factory=dict)  # query id -> independent uniform sources
    preprocess_ms: dict[str, float] = field(default_factory=dict)  # model -> CPU pre-processing per request
    preprocess_threads: int = 1  # CPU threads pre-processing one batch without OL (serial_preprocess)

    def preprocess(self, model: str) -> float:
        """CPU pre-processing per request of ``model`` (ms; 0 if none declared). A prefix-batched model
        ``<group>@<slo>`` takes its group's (one value per group)."""
        if model in self.preprocess_ms:
            return self.preprocess_ms[model]
        group = next((g for g in self.prefix_groups if model.rsplit("@", 1)[0] == g.name), None)
        return self.preprocess_ms.get(group.models[0], 0.0) if group else 0.0

    def session_streams(self) -> dict[str, int]:
        """Uniform sources feeding each query's root stage session (``query_id/root``)."""
        return {f"{q.query_id}/{q.root}": self.streams[q.query_id] for q in self.queries if q.query_id in self.streams}

    def chains(self) -> dict[str, tuple[str, float]]:
        """``{stage session: (parent stage session, γ)}`` for every non-root query stage (simulator chaining)."""
        return {f"{q.query_id}/{st.name}": (f"{q.query_id}/{st.parent}", st.gamma)
                for q in self.queries for st in q.stages if st.parent is not None}


_MODEL_FIELDS = {"name", "alpha_ms", "beta_ms", "max_batch", "table", "preprocess_ms", "memory_mb"}
_SESSION_FIELDS = {"id", "model", "slo_ms", "rate"}
_QUERY_FIELDS = {"id", "slo_ms", "rate", "streams", "stages"}
_STAGE_FIELDS = {"name", "model", "parent", "gamma"}
_GROUP_FIELDS = {"name", "prefix", "suffix", "models", "preprocess_ms"}
_SUFFIX_FIELDS = {"alpha_ms", "beta_ms", "memory_mb"}
_SIMULATION_FIELDS = {"duration_s", "arrivals", "seed", "noise", "epsilon_ms"}








def _batch_size(key: Any, field: str) -> int:
    """A ``table`` key: a batch size >= 1 (a YAML number, or its digits as JSON object keys are text)."""
    if isinstance(key, str) and key.isascii() and key.isdigit():
        key = int(key)
    if isinstance(key, bool) or not isinstance(key, int) or not 1 <= key <= MAX_BATCH:
        raise ConfigError(field, key, f"batch sizes (the table's keys) must be whole numbers from 1 to {MAX_BATCH:,}")
    return key


def _models(raw: list[dict[str, Any]], builtin: dict[str, BatchProfile]
            ) -> tuple[dict[str, BatchProfile], dict[str, float]]:
    """Scenario models and their ``preprocess_ms``; an entry with only a built-in ``name`` (and
    ``preprocess_ms``) keeps the built-in profile; ``memory_mb`` is the GPU memory a placement holds."""
    out, pre = {}, {}
    for i, m in enumerate(raw):
        where = f"models[{i}]."
        name = label(require(m, "name", where), f"{where}name")
        if "preprocess_ms" in m:
            pre[name] = positive(m["preprocess_ms"], f"{where}preprocess_ms", allow_zero=True, upper=MAX_MS)
        if "table" in m:
            table = mapping(m["table"], f"{where}table", optional=False)
            prof = table_profile(name, {_batch_size(b, f"{where}table"): positive(v, f"{where}table.{b}", upper=MAX_MS)
                                        for b, v in table.items()})
        elif "alpha_ms" in m or name not in builtin:
            prof = linear_profile(name, positive(require(m, "alpha_ms", where), f"{where}alpha_ms", allow_zero=True,
                                                 upper=MAX_MS),
                                  positive(require(m, "beta_ms", where), f"{where}beta_ms", allow_zero=True,
                                           upper=MAX_MS),
                                  integer(m.get("max_batch", 64), f"{where}max_batch", minimum=1, maximum=MAX_BATCH))
        else:
            prof = None  # a built-in model keeps its profile
        if "memory_mb" in m:
            mem = int(positive(m["memory_mb"], f"{where}memory_mb", allow_zero=True, upper=MAX_MB) * MIB)
            base = prof or builtin[name]
            prof = replace(base, memory_bytes=tuple(mem for _ in base.batches))
        if prof is not None:
            out[name] = prof
    return out, pre


def _sessions(raw: list[dict[str, Any]]) -> tuple[Session, ...]:
    """``sessions: [{id, model, slo_ms, rate}]``; types here, ranges in ``Session`` (named by its id)."""
    return tuple(Session(label(require(s, "id", f"sessions[{i}]."), f"sessions[{i}].id"),
                         label(require(s, "model", f"sessions[{i}]."), f"sessions[{i}].model"),
                         number(require(s, "slo_ms", f"sessions[{i}]."), f"sessions[{i}].slo_ms", upper=MAX_MS),
                         number(require(s, "rate", f"sessions[{i}]."), f"sessions[{i}].rate", upper=MAX_RATE))
                 for i, s in enumerate(raw))


def _queries(raw: list[dict[str, Any]]) -> tuple[Query, ...]:
    """``queries: [{id, slo_ms, rate, stages: [{name, model, parent, gamma}]}]``; types here, the tree and
    the ranges in ``Query``."""
    out = []
    for i, q in enumerate(raw):
        where = f"queries[{i}]."
        stages = []
        for j, st in enumerate(entries(require(q, "stages", where), f"{where}stages", _STAGE_FIELDS)):
            at = f"{where}stages[{j}]."
            parent = st.get("parent")
            stages.append(QueryStage(label(require(st, "name", at), f"{at}name"),
                                     label(require(st, "model", at), f"{at}model"),
                                     None if parent is None else label(parent, f"{at}parent"),
                                     number(st.get("gamma", 1.0), f"{at}gamma", upper=MAX_FANOUT)))
        out.append(Query(label(require(q, "id", where), f"{where}id"), tuple(stages),
                         number(require(q, "slo_ms", where), f"{where}slo_ms", upper=MAX_MS),
                         number(require(q, "rate", where), f"{where}rate", upper=MAX_RATE)))
    return tuple(out)


def load(path: str) -> NexusScenario:
    """Parse and validate a Nexus scenario file (JSON or YAML)."""
    raw = load_scenario(path)
    known = {"name", "preset", "models", "sessions", "queries", "gpus", "simulation", "prefix_groups",
             "preprocess_threads"}
    for key in raw:
        if key not in known:
            raise ConfigError(key, raw[key], f"unknown scenario field; expected one of {sorted(known)}")
    preset = choose(raw.get("preset", "paper"), "preset", list(PRESETS))
    builtin = {**published_profiles(), **synthetic_profiles()}
    models, pre = _models(entries(raw.get("models"), "models", _MODEL_FIELDS), builtin)
    profiles = {**builtin, **models}
    raw_groups = entries(raw.get("prefix_groups"), "prefix_groups", _GROUP_FIELDS)
    groups = _prefix_groups(raw_groups, profiles)
    for i, g in enumerate(raw_groups):
        if "preprocess_ms" in g:
            p = positive(g["preprocess_ms"], f"prefix_groups[{i}].preprocess_ms", allow_zero=True, upper=MAX_MS)
            pre.update({m: p for m in groups[i].models})
    profiles.update(variant_profiles(groups, profiles))
    sessions = _sessions(entries(raw.get("sessions"), "sessions", _SESSION_FIELDS))
    raw_queries = entries(raw.get("queries"), "queries", _QUERY_FIELDS)
    queries = _queries(raw_queries)
    if not sessions and not queries:
        raise ConfigError("sessions", [], "a scenario needs at least one session or query")
    ids = [s.session_id for s in sessions] + [q.query_id for q in queries]
    if len(set(ids)) != len(ids):
        raise ConfigError("sessions", ids, "session and query ids must be unique")
    for s in sessions:
        if s.model not in profiles:
            raise ConfigError(f"{s.session_id}.model", s.model, f"unknown model; choose one of {sorted(profiles)}")
    for q in queries:
        for st in q.stages:
            if st.model not in profiles:
                raise ConfigError(f"{q.query_id}.{st.name}.model", st.model,
                                  f"unknown model; choose one of {sorted(profiles)}")
    streams = {q.query_id: integer(raw_queries[i].get("streams", 1), f"queries[{i}].streams", minimum=1,
                                   maximum=MAX_COUNT)
               for i, q in enumerate(queries)}  # independent uniform sources, e.g. cameras
    grouped = {m for g in groups for m in g.models}
    for q in queries:
        for st in q.stages:
            if st.model in grouped:
                raise ConfigError(f"{q.query_id}.{st.name}.model", st.model, "query stages are chained request by "
                                  "request and cannot be prefix-batched; use it in a standalone session")
    sim = section(raw.get("simulation"), "simulation", _SIMULATION_FIELDS)
    gpus = None if raw.get("gpus") is None else integer(raw["gpus"], "gpus", minimum=1, maximum=MAX_GPUS)
    duration_s = positive(sim.get("duration_s", 20.0), "simulation.duration_s", upper=MAX_SECONDS)
    within_events(duration_s * (sum(s.rate for s in sessions) + sum(q.rate for q in queries)), "simulation.duration_s",
                  duration_s, "requests (the sessions' and queries' rates x duration_s)")
    return NexusScenario(
        name=label(raw.get("name", path), "name"), preset=preset, profiles=profiles, sessions=sessions,
        queries=queries, gpus=gpus, duration_s=duration_s,
        arrivals=choose(sim.get("arrivals", "poisson"), "simulation.arrivals", ["poisson", "uniform"]),
        seed=integer(sim.get("seed", 0), "simulation.seed", minimum=0, maximum=MAX_SEED),
        noise=flag(sim.get("noise", False), "simulation.noise"),
        epsilon_ms=positive(sim.get("epsilon_ms", 1.0), "simulation.epsilon_ms", upper=MAX_MS), prefix_groups=groups,
        streams={k: v for k, v in streams.items() if v > 1}, preprocess_ms={m: p for m, p in pre.items() if p > 0},
        preprocess_threads=integer(raw.get("preprocess_threads", 1), "preprocess_threads", minimum=1,
                                   maximum=MAX_BATCH))




def _prefix_groups(raw: list[dict[str, Any]], profiles: dict[str, BatchProfile]) -> tuple[PrefixGroup, ...]:
    """``prefix_groups: [{name, prefix: <model>, suffix: {alpha_ms, beta_ms, memory_mb}, models: [...],
    preprocess_ms}]`` (``preprocess_ms`` is read by ``load``)."""
    out = []
    for i, g in enumerate(raw):
        where = f"prefix_groups[{i}]."
        name = label(require(g, "name", where), f"{where}name")
        prefix = label(require(g, "prefix", where), f"{where}prefix")
        if prefix not in profiles:
            raise ConfigError(f"{where}prefix", prefix, f"unknown model; choose one of {sorted(profiles)}")
        suf = section(require(g, "suffix", where), f"{where}suffix", _SUFFIX_FIELDS)
        base = profiles[prefix]
        suffix = linear_profile(f"{name}.suffix", positive(suf.get("alpha_ms", 0.0), f"{where}suffix.alpha_ms",
                                                           allow_zero=True, upper=MAX_MS),
                                positive(require(suf, "beta_ms", f"{where}suffix."), f"{where}suffix.beta_ms",
                                         upper=MAX_MS),
                                base.max_batch,
                                int(positive(suf.get("memory_mb", 0.0), f"{where}suffix.memory_mb",
                                             allow_zero=True, upper=MAX_MB) * MIB))
        out.append(PrefixGroup(name, base, suffix, tuple(names(require(g, "models", where), f"{where}models"))))
    return tuple(out)


def scaled_sessions(sc: NexusScenario, strategy: Strategy, load: float = 1.0
                    ) -> tuple[list[Session], dict[str, BatchProfile]]:
    """The sessions to place and their profiles: the scenario's sessions plus its queries' stage sessions
    (split by DP or evenly), rates × ``load``, then — with prefix batching — each prefix group's equal-SLO
    sessions merged into one session of a prefix-batched model (epoch steps 1–2, §6.1), then the CPU model
    (module docstring): with OL every session's SLO becomes its GPU budget ``SLO − p``; without OL every
    profile with ``p > 0`` becomes ``serial_preprocess``'s ``⌈b/k⌉·p + ℓ(b)`` (``k = preprocess_threads``). A query's split divides the whole
    SLO, pre-processing included: a stage's throughput at budget ``k`` is its GPU's at ``k − p`` (OL) or that of
    the serialised profile (no OL)."""
    profiles = dict(sc.profiles)
    if not strategy.overlap:
        profiles.update({m: serial_preprocess(profiles[m], p, sc.preprocess_threads)
                         for m, p in sc.preprocess_ms.items()})
    out = [replace(s, rate=s.rate * load) for s in sc.sessions]
    for q in sc.queries:
        q = replace(q, rate=q.rate * load)
        tput = {st.name: _stage_throughput(profiles[st.model], sc.preset,
                                           sc.preprocess(st.model) if strategy.overlap else 0.0) for st in q.stages}
        split = split_slo(q, tput, sc.epsilon_ms) if strategy.query_split == "dp" else even_split(q, tput)
        out += split.sessions(q)
    if strategy.prefix_batching and sc.prefix_groups:
        out, extra = merge_sessions(out, sc.prefix_groups)
        if not strategy.overlap:
            extra = {m: serial_preprocess(prof, sc.preprocess(m), sc.preprocess_threads) for m, prof in extra.items()}
        profiles.update(extra)
    if strategy.overlap:
        out = [_gpu_budget(s, sc.preprocess(s.model)) for s in out]
    return out, profiles


def _stage_throughput(profile: BatchProfile, preset: str, preprocess_ms: float) -> Throughput:
    """A query stage's best one-GPU req/s at a stage budget of ``k`` ms of which ``preprocess_ms`` is CPU work."""
    gpu = profile_throughput(profile, preset)
    return gpu if preprocess_ms == 0 else lambda k: gpu(k - preprocess_ms)


def _gpu_budget(s: Session, preprocess_ms: float) -> Session:
    """With OL: the session's SLO less its overlapped pre-processing, the budget the GPU is planned with."""
    if preprocess_ms == 0:
        return s
    if s.slo_ms <= preprocess_ms:
        raise ConfigError(f"{s.session_id}.slo_ms", s.slo_ms, f"must exceed its model's preprocess_ms "
                          f"({preprocess_ms:g} ms)")
    return replace(s, slo_ms=s.slo_ms - preprocess_ms)


def ready_delays(sc: NexusScenario, strategy: Strategy, sessions: list[Session]) -> dict[str, float]:
    """Per session id, the overlapped pre-processing before a request can join a batch (OL; none without)."""
    if not strategy.overlap:
        return {}
    return {s.session_id: p for s in sessions if (p := sc.preprocess(s.model)) > 0}


def build_plan(sc: NexusScenario, strategy: Strategy, load: float = 1.0, gpus: int | None = None) -> Plan:
    """The plan ``strategy`` makes for the scenario at ``load`` × its rates.

    With a fixed cluster of ``gpus`` GPUs every scheduler uses all of it: the batch-oblivious one scales its
    shares to the cluster (§7.2); squishy packing plans for the largest rate headroom ``h ≥ 1`` (rates × h,
    bisected geometrically on [1, 4]) that the cluster holds with nothing unassigned, the capped plan
    spilling residual rates into the cluster (the authors' ``FindBestBackend``, ``SquishyPacker.plan(
    max_gpus=...)``), so Poisson bursts meet spare capacity instead of GPUs at occupancy 1 (inferred). A plan
    that only fits Algorithm 1's whole GPUs left GPUs idle: Algorithm 1's count steps with h (its residual
    nodes are not split), e.g. 15 of 16 GPUs at the largest fitting step of the traffic case study.
    When even ``h = 1`` does not fit, the capped plan splits residual rates into the cluster and lists the
    rest in ``Plan.unassigned`` (``SquishyPacker.plan(max_gpus=...)``); that load is still offered, and the
    simulator routes it onto GPUs (``route_unassigned``) where the dispatcher serves or drops it.
    """
    sessions, profiles = scaled_sessions(sc, strategy, load)
    if strategy.placement == "batch_oblivious":
        return batch_oblivious_plan(sessions, profiles, sc.preset, gpus)
    packer = SquishyPacker(profiles, sc.preset, colocate=strategy.placement == "squishy")
    plan = packer.plan(sessions)
    if gpus is None:
        return plan
    if plan.num_gpus > gpus:
        return packer.plan(sessions, max_gpus=gpus)

    def held(h: float) -> Plan | None:
        trial = packer.plan([replace(s, rate=s.rate * h) for s in sessions], max_gpus=gpus)
        return None if trial.unassigned else trial

    lo, hi = 1.0, MAX_HEADROOM
    best = held(hi)
    if best is not None:
        return best
    best = held(lo) or plan
    for _ in range(HEADROOM_STEPS):
        mid = math.sqrt(lo * hi)
        trial = held(mid)
        lo, hi, best = (mid, hi, trial) if trial is not None else (lo, mid, best)
    return best


MAX_HEADROOM, HEADROOM_STEPS = 4.0, 10  # h resolved to (4)^(1/2^10) ≈ 0.14 %


def evaluate(sc: NexusScenario, strategy: Strategy, load: float = 1.0, gpus: int | None = None,
             duration_s: float | None = None, log_batches: bool = False) -> tuple[Plan, SimResult]:
    """Plan at ``load`` and simulate the plan with the strategy's batch policy (and CPU model)."""
    plan = build_plan(sc, strategy, load, gpus)
    sessions, profiles = scaled_sessions(sc, strategy, load)
    res = simulate_plan(plan, profiles, make_batch_policy(strategy.batch_policy),
                        rates={s.session_id: s.rate for s in sessions},
                        duration_s=duration_s or sc.duration_s,
                        arrivals=sc.arrivals, noise=sc.noise, seed=sc.seed, streams=sc.session_streams(),
                        chains=sc.chains(), ready_ms=ready_delays(sc, strategy, sessions), log_batches=log_batches,
                        load_balancer=strategy.load_balancer)
    return plan, res


def paper_bad_rate(sc: NexusScenario, res: SimResult) -> float:
    """Bad rate in the unit of the paper's throughput metric (§7: the rate of *queries* of which 99 % are
    served within their SLOs): a standalone session's request counts once, and so does a query (one root
    request), which is bad when any of its chained stage requests is dropped or late."""
    chained = [q for q in sc.queries if len(q.stages) > 1]  # a one-stage query is one request: standalone
    stages = {f"{q.query_id}/{st.name}" for q in chained for st in q.stages}
    roots = [f"{q.query_id}/{q.root}" for q in chained]
    bad = sum(len(res.bad_queries.get(r, ())) for r in roots)
    units = sum(res.sessions[r].offered for r in roots if r in res.sessions)
    for sid, st in res.sessions.items():
        if sid not in stages:
            bad += st.late + st.dropped
            units += st.offered
    return bad / units if units else 0.0


def within_target(sc: NexusScenario, strategy: Strategy, load: float, gpus: int, target_bad: float = 0.01,
                  duration_s: float | None = None) -> bool:
    """Whether ``strategy`` on ``gpus`` GPUs serves ``load`` × the scenario's rates with a measured bad rate
    (``paper_bad_rate``) ≤ ``target_bad``; load no GPU has memory for counts as lost outright (see ``max_load``)."""
    plan, res = evaluate(sc, strategy, load, gpus, duration_s)
    nowhere = route_unassigned(plan, scaled_sessions(sc, strategy, load)[1]).unassigned
    lost = sum(r for _, r in nowhere) / max(sum(s.rate for s in plan.sessions), 1e-12)
    return lost <= target_bad and paper_bad_rate(sc, res) <= target_bad


def fewest_gpus(sc: NexusScenario, strategy: Strategy, upto: int, target_bad: float = 0.01) -> int | None:
    """Fewest GPUs on which ``strategy`` (its plan for that cluster) measures ≤ ``target_bad`` at the base
    load — every scheduler judged alike, by measurement; ``None`` if even ``upto`` GPUs do not.

    The scan starts at ``⌊(1 − target_bad) · Σ R_i/T_i^opt⌋`` (§7.4 lower bound): fewer GPUs cannot serve the
    good share of the load at any batch size.
    """
    sessions, profiles = scaled_sessions(sc, strategy)
    start = max(1, math.floor((1 - target_bad) * gpu_lower_bound(sessions, profiles)))
    return next((g for g in range(start, upto + 1) if within_target(sc, strategy, 1.0, g, target_bad)), None)


def max_load(sc: NexusScenario, strategy: Strategy, gpus: int, *, target_bad: float = 0.01, iters: int = 8,
             duration_s: float | None = None) -> float:
    """Largest load multiplier at which ``strategy`` on ``gpus`` GPUs has a measured bad rate ≤ ``target_bad``.

    Every strategy is judged the same way, by the simulated bad rate in the paper's unit
    (``paper_bad_rate``: a query counts once, bad if any of its stages is): a capped plan's unassigned load is
    routed and measured like the batch-oblivious plan's SLO-violating placements, not rejected up front.
    Only load that no GPU has memory for (``route_unassigned`` leaves it unassigned) is counted as lost
    outright: the frontend drops all of it, even where a small sample at a tiny load shows no request.
    Bisection over the load multiplier.
    """
    def ok(load: float) -> bool:
        return within_target(sc, strategy, load, gpus, target_bad, duration_s)

    lo, hi = 0.0, 1.0
    while ok(hi) and hi < 1024:
        lo, hi = hi, hi * 2
    if lo == 0.0:
        hi_probe = 1.0
        while not ok(hi_probe / 2) and hi_probe > 1e-3:
            hi_probe /= 2
        lo, hi = hi_probe / 2, hi_probe
        if not ok(lo):
            return 0.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def run(scenario_path: str, policies: list[str] | None = None) -> SimulationReport:
    """Simulate each named policy (default all) on the scenario; one table row per policy."""
    sc = load(scenario_path)
    names = policies or list(POLICIES)
    for n in names:
        choose(n, "policy", list(POLICIES))
    rows, summary = [], {}
    for n in names:
        st = POLICIES[n]
        plan, res = evaluate(sc, st, gpus=sc.gpus)
        offered = res.total("offered")
        rows.append({"policy": n, "placement": st.placement, "batch_policy": st.batch_policy,
                     "query_split": st.query_split, "prefix_batching": st.prefix_batching, "overlap": st.overlap,
                     "gpus": plan.num_gpus,
                     "offered_rps": offered / sc.duration_s, "good_rps": res.total("good") / sc.duration_s,
                     "bad_rate": res.bad_rate, "query_bad_rate": paper_bad_rate(sc, res),
                     "dropped": res.total("dropped"), "late": res.total("late"),
                     "mean_batch": res.mean_batch, "slo_violations_in_plan": len(plan.violations())})
        summary[f"{n}_gpus"] = float(plan.num_gpus)
        summary[f"{n}_bad_rate"] = res.bad_rate
        summary[f"{n}_query_bad_rate"] = rows[-1]["query_bad_rate"]
    return SimulationReport("nexus", rows, summary)
