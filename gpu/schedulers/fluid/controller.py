"""FLUID's executor: turns StaticFluid/DynamicFluid widths into placements on concrete GPUs (thesis §3.3.3).

FLUID acts only "when new TrialGroups are added or some resources are freed" (§3.3.3): ``on_group`` runs
Algorithm 3.1 on the idle GPUs, starts wide trials on ``floor(w*)`` dedicated GPUs and packs small ones ``c``
per GPU longest-first (next-fit-decreasing-height, Lemmas 1–2), queueing the rest; ``on_trial_done`` frees
slots and starts queued trials on any slot with room (Lemma 1); ``rebalance`` runs Algorithm 3.2 for every
group whose queue is empty (resizes take effect at the end of the trial's current iteration). Several groups
at once are served in submission order and StaticFluid only uses idle GPUs (the thesis schedules "idle
resources" only; docs/fluid.md).

``FluidExecutor`` is a ``gpu.contract.Controller`` (system ``"fluid"``, hooks ``on_group`` and
``on_trial_done``, each taking the world's ``now`` first). Every call returns a ``Step`` (frozen): which trials
start, which change width, which stop — exactly what a Prefect flow launches on GPU-pool slices. The simulator
(``gpu.sim.fluid.run``) drives the same object on its virtual clock, the flow on the wall clock; ``now`` also gives
each TrialGroup's makespan (arrival to its last trial's end, the quantity FLUID minimises, §3.3.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu.errors import ConfigError
from gpu.schedulers.fluid.algorithms import FluidParams, RunningTrial, Trial, TrialGroup, dynamic_fluid, static_fluid

_TOL = 1e-9


@dataclass(frozen=True)
class TrialPlacement:
    """Where a trial runs: ``width`` < 1 is that fraction of ``gpus[0]``; >= 1 is ``len(gpus)`` whole GPUs.

    Example: ``TrialPlacement("c0001@0", 0.5, (3,))`` shares GPU 3; ``TrialPlacement("c0007@2", 3.0, (0, 1, 2))``.
    """

    trial_id: str
    width: float
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """One scheduling decision: trials to start, trials to move to a new placement, trials to stop."""

    starts: tuple[TrialPlacement, ...] = ()
    resizes: tuple[TrialPlacement, ...] = ()
    stops: tuple[str, ...] = ()

    def then(self, later: Step) -> Step:
        """Merge a later decision taken at the same instant (a resize of a just-started trial edits its start)."""
        starts = {p.trial_id: p for p in self.starts}
        resizes = {p.trial_id: p for p in self.resizes}
        for p in later.resizes:
            if p.trial_id in starts:
                starts[p.trial_id] = p
            else:
                resizes[p.trial_id] = p
        for p in later.starts:
            starts[p.trial_id] = p
        stops = self.stops + tuple(t for t in later.stops if t not in self.stops)
        for t in later.stops:
            starts.pop(t, None)
            resizes.pop(t, None)
        return Step(tuple(starts.values()), tuple(resizes.values()), stops)


class GroupClock:
    """When each TrialGroup arrived and when its last trial ended, on the world's clock (§3.3.2 makespan)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.arrived: dict[str, float] = {}
        self.makespans: dict[str, float] = {}
        self._left: dict[str, int] = {}

    def tick(self, now: float) -> None:
        """Advance to ``now``; a world whose clock runs backwards is a bug worth naming."""
        if not now >= self.now:
            raise ConfigError("now", now, f"the world's clock went backwards (last event at {self.now})")
        self.now = float(now)

    def start(self, group_id: str, members: int) -> None:
        self.arrived[group_id] = self.now
        self._left[group_id] = members

    def finish(self, group_id: str) -> None:
        """One of the group's trials ended (or was dropped); the last one closes its makespan."""
        self._left[group_id] -= 1
        if self._left[group_id] == 0:
            self.makespans[group_id] = self.now - self.arrived[group_id]


@dataclass
class PlacementBook:
    """Which trial holds which share of which GPU (the executor's view; real leases live in ``gpu.ledger``)."""

    gpus: list[int]
    load: dict[int, float] = field(default_factory=dict)
    residents: dict[int, set[str]] = field(default_factory=dict)
    running: dict[str, TrialPlacement] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(set(self.gpus)) != len(self.gpus):
            raise ConfigError("gpus", self.gpus, "GPU ids must be unique")
        for g in self.gpus:
            self.load.setdefault(g, 0.0)
            self.residents.setdefault(g, set())

    def idle(self) -> list[int]:
        return [g for g in self.gpus if not self.residents[g]]

    def room_for(self, width: float) -> int | None:
        """A GPU for a fractional trial: the fullest shared GPU with room (next fit), else an idle one."""
        shared = [g for g in self.gpus if self.residents[g] and self.load[g] + width <= 1 + _TOL
                  and all(self.running[t].width < 1 for t in self.residents[g])]
        if shared:
            return max(shared, key=lambda g: (self.load[g], -self.gpus.index(g)))
        idle = self.idle()
        return idle[0] if idle else None

    def place(self, trial_id: str, width: float, gpus: tuple[int, ...]) -> TrialPlacement:
        share = width if width < 1 else 1.0
        for g in gpus:
            self.load[g] += share
            self.residents[g].add(trial_id)
        self.running[trial_id] = TrialPlacement(trial_id, width, gpus)
        return self.running[trial_id]

    def free(self, trial_id: str) -> TrialPlacement:
        p = self.running.pop(trial_id)
        for g in p.gpus:
            self.load[g] = max(0.0, self.load[g] - (p.width if p.width < 1 else 1.0))
            self.residents[g].discard(trial_id)
        return p


class FluidExecutor:
    """Runs TrialGroups with StaticFluid (and DynamicFluid unless ``dynamic=False``) on a set of GPUs.

    A ``gpu.contract.Controller``: ``policy`` is ``"fluid"`` (Algorithms 3.1 + 3.2) or ``"static_fluid"``.

    Args:
        gpus: ids of the GPUs this tuning job may use (e.g. pool device indices).
        params: ``c``, ``d``, ``epsilon``.
        dynamic: run Algorithm 3.2 in ``rebalance`` (False = StaticFluid only).
        concurrency: trials in flight that ``open_slots`` aims for when an asynchronous algorithm hands out
            work (default ``c * len(gpus)``, so packing can add concurrency; Fig. 3.10 fixes it at 8).
    """

    system = "fluid"
    hooks = ("on_group", "on_trial_done")

    def __init__(self, gpus: list[int], params: FluidParams, dynamic: bool = True, concurrency: int | None = None):
        if not gpus:
            raise ConfigError("gpus", gpus, "FLUID needs at least one GPU")
        if concurrency is not None and concurrency < 1:
            raise ConfigError("concurrency", concurrency, "must be >= 1 trials")
        self.params = params
        self.dynamic = dynamic
        self.policy = "fluid" if dynamic else "static_fluid"
        self.clock = GroupClock()
        self.book = PlacementBook(list(gpus))
        self._concurrency = concurrency
        self.trials: dict[str, Trial] = {}
        self.done: dict[str, float] = {}
        self.group_of: dict[str, str] = {}
        self.queues: dict[str, list[str]] = {}  # group id -> queued trial ids, submission order of groups

    # --- what a flow asks -------------------------------------------------------------------------------
    @property
    def running(self) -> dict[str, TrialPlacement]:
        return dict(self.book.running)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def open_slots(self) -> int:
        """How many new trials an asynchronous algorithm should hand out now."""
        target = self._concurrency or self.params.c * len(self.book.gpus)
        return max(0, target - len(self.book.running) - self.queued)

    def idle(self) -> bool:
        return not self.book.running and not self.queued

    # --- events -----------------------------------------------------------------------------------------
    @property
    def group_makespans(self) -> dict[str, float]:
        """Seconds from each finished TrialGroup's arrival to its last trial's end (§3.3.2)."""
        return dict(self.clock.makespans)

    def on_group(self, now: float, group: TrialGroup) -> Step:
        """Algorithm 3.1 on the idle GPUs; wide trials start at once, small ones pack or queue."""
        if group.group_id in self.queues:
            raise ConfigError("group_id", group.group_id, "already submitted")
        for t in group.trials:
            if t.trial_id in self.trials:
                raise ConfigError("trial_id", t.trial_id, "already submitted in another group")
        self.clock.tick(now)
        self.clock.start(group.group_id, len(group.trials))
        idle = self.book.idle()
        plan = static_fluid(group.trials, len(idle), self.params)
        self.queues[group.group_id] = []
        starts = []
        for t in group.trials:
            self.trials[t.trial_id] = t
            self.done[t.trial_id] = 0.0
            self.group_of[t.trial_id] = group.group_id
        for trial_id, width in plan.widths:
            if width >= 1 and len(idle) >= int(width):
                gpus, idle = tuple(idle[: int(width)]), idle[int(width):]
                starts.append(self.book.place(trial_id, width, gpus))
            else:
                self.queues[group.group_id].append(trial_id)
        return Step(tuple(starts)).then(self._drain())

    def on_progress(self, trial_id: str, iterations_done: float) -> None:
        """A trial reports the iterations it has finished in this group (DynamicFluid uses what remains)."""
        self._known(trial_id)
        self.done[trial_id] = min(float(iterations_done), self.trials[trial_id].budget)

    def on_trial_done(self, now: float, trial_id: str) -> Step:
        """A trial finished its budget: free its slots and start queued trials on them."""
        self._known(trial_id)
        self.clock.tick(now)
        self._forget(trial_id)
        return self._drain()

    def terminate(self, now: float, trial_id: str) -> Step:
        """The algorithm drops a trial (early stop): stop it if running, drop it if queued."""
        self._known(trial_id)
        self.clock.tick(now)
        was_running = trial_id in self.book.running
        self._forget(trial_id)
        return Step(stops=(trial_id,) if was_running else ()).then(self._drain())

    def on_resources_changed(self, gpus: list[int]) -> Step:
        """The cluster grants or takes GPUs: trials on removed GPUs stop and re-queue (resume from checkpoint)."""
        if not gpus or len(set(gpus)) != len(gpus):
            raise ConfigError("gpus", gpus, "need at least one GPU and unique ids")
        removed = set(self.book.gpus) - set(gpus)
        stops = sorted({t for g in removed for t in self.book.residents[g]})
        for t in stops:
            self.book.free(t)
            self.queues[self.group_of[t]].insert(0, t)
        for g in removed:
            del self.book.load[g], self.book.residents[g]
        self.book.gpus = list(gpus)
        for g in gpus:
            self.book.load.setdefault(g, 0.0)
            self.book.residents.setdefault(g, set())
        return Step(stops=tuple(stops)).then(self._drain())

    def rebalance(self) -> Step:
        """Algorithm 3.2 for each group with an empty queue, over its committed GPUs plus the idle ones."""
        step = Step()
        if not self.dynamic:
            return step
        for gid, queue in self.queues.items():
            members = [t for t, p in self.book.running.items() if self.group_of[t] == gid]
            if queue or not members:
                continue
            own = {g for g in self.book.gpus if self.book.residents[g]
                   and all(self.group_of[t] == gid for t in self.book.residents[g])}
            n = len(own) + len(self.book.idle())
            running = [RunningTrial(t, self._h1_remaining(t), self.book.running[t].width,
                                    self.trials[t].alpha, self.trials[t].beta) for t in members]
            resizes = dynamic_fluid(running, n, self.params)
            moved = [self._resize(r.trial_id, r.new_width) for r in resizes if not r.is_scale_up]
            moved += [self._resize(r.trial_id, r.new_width) for r in resizes if r.is_scale_up]
            step = step.then(Step(resizes=tuple(p for p in moved if p is not None)))
        return step

    # --- helpers ----------------------------------------------------------------------------------------
    def _known(self, trial_id: str) -> None:
        if trial_id not in self.trials:
            raise ConfigError("trial_id", trial_id, "unknown to this executor")

    def _forget(self, trial_id: str) -> None:
        if trial_id in self.book.running:
            self.book.free(trial_id)
        gid = self.group_of[trial_id]
        if trial_id in self.queues[gid]:
            self.queues[gid].remove(trial_id)
        del self.trials[trial_id], self.done[trial_id], self.group_of[trial_id]
        self.clock.finish(gid)

    def _h1_remaining(self, trial_id: str) -> float:
        t = self.trials[trial_id]
        return max(0.0, t.budget - self.done[trial_id]) * t.iter_time_s

    def _drain(self) -> Step:
        """Start queued trials (groups in submission order, longest first) at ``1/c`` on any slot with room."""
        starts = []
        width = 1.0 / self.params.c
        for queue in self.queues.values():
            while queue:
                g = self.book.room_for(width)
                if g is None:
                    return Step(tuple(starts))
                starts.append(self.book.place(queue.pop(0), width, (g,)))
        return Step(tuple(starts))

    def _resize(self, trial_id: str, width: float) -> TrialPlacement | None:
        """Apply one DynamicFluid resize if the GPUs exist; keep the trial's first GPU where possible."""
        old = self.book.running[trial_id]
        if width < 1:
            self.book.free(trial_id)
            return self.book.place(trial_id, width, old.gpus[:1])
        keep = old.gpus if old.width >= 1 else tuple(g for g in old.gpus if self.book.residents[g] == {trial_id})
        keep = keep[: int(width)]
        extra = [g for g in self.book.idle() if g not in keep][: int(width) - len(keep)]
        if len(keep) + len(extra) < int(width):
            return None
        self.book.free(trial_id)
        return self.book.place(trial_id, width, tuple(keep) + tuple(extra))
