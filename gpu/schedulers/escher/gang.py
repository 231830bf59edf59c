"""Gang scheduling as ESCHER writes it (§4.4e, Table 4.2 "Gang", Fig. 4.7): all-or-none, three ways.

* ``AppSpaceGang`` (78 lines in the paper): one *ghost* per member requests the member's physical
  bundle; each ghost that starts adds a unit of ``gang-<g>`` on its node (P4 locking). When every ghost
  runs, the members launch requesting ``{gang-<g>: 1}`` and nothing physical (the ghost holds it). If
  not all ghosts start within ``timeout`` the gang rolls back — ghosts withdrawn, ``gang-<g>`` deleted —
  and retries after a jittered exponential back-off: concurrent gangs can deadlock each other, and the
  timeout is what breaks it (the paper's "higher variance and a longer tail").
* ``LibSpaceGang`` (261 lines): the same ghosts, serialized through a shared lock, so gangs never hold
  parts of the cluster against each other and never time out (the paper's "higher minimum latency").
  The serializer is a capacity-1 ephemeral resource ``gang-lock`` used as a mutex (P2's semaphore),
  which works on every ledger without a separate service.
* ``FrameSpaceGang`` (Ray modified, 1624 lines): the scheduler grants every member's bundle in one
  transaction (``PoolLedger.grant_all``), no ghosts; the analogue of a Ray placement group.

Each is a small state machine returning ``GangStep`` decisions; the world (``gpu.sim.escher.run`` or a
flow) queues and cancels the requests, applies the ``Actions`` and calls back. Defaults (the paper gives none):
``timeout`` 5 s, back-off 0.1 s doubling with ±50 % jitter, capped at 10 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from gpu.errors import ConfigError
from gpu.placement import ResourceRequest
from gpu.schedulers.escher.api import Actions, SetResource
from gpu.scenario import positive

LOCK = "gang-lock"


@dataclass(frozen=True)
class Gang:
    """A gang: ``members`` are the physical bundles that must run together (e.g. 8 x ``ResourceRequest(cpus=1)``)."""

    gang_id: str
    members: tuple[ResourceRequest, ...]

    def __post_init__(self) -> None:
        if not self.members:
            raise ConfigError("gang.members", self.members, "a gang of 0 tasks has nothing to run")

    @property
    def resource(self) -> str:
        return f"gang-{self.gang_id}"

    def ghost(self, i: int) -> ResourceRequest:
        """Ghost ``i``: member ``i``'s physical bundle, held for the member."""
        m = self.members[i]
        return replace(m, resources=dict(m.resources), label=f"ghost-{self.gang_id}-{i}")

    def member(self, i: int) -> ResourceRequest:
        """Member ``i`` as it launches once the ghosts hold the bundles: one unit of ``gang-<g>``, nothing physical."""
        return ResourceRequest(resources={self.resource: 1.0}, label=f"{self.gang_id}-{i}")


@dataclass(frozen=True)
class GangStep:
    """What the world does next for one gang.

    ``submit``: ghost indices to queue; ``grant_all``: try every bundle in one transaction
    (FrameSpace); ``lock``: queue the serializer request; ``rollback``: withdraw the queued ghosts
    and end the running ones; ``unlock``: release the serializer; ``launch``: the members to start;
    ``wake_at``: when to call ``on_timer`` (``on_retry`` after a rollback). A world calls ``on_ghost_lost``
    when a running ghost's lease is gone and ``on_finished`` once every member has ended.
    """

    submit: tuple[int, ...] = ()
    grant_all: bool = False
    lock: bool = False
    rollback: bool = False
    unlock: bool = False
    actions: Actions = Actions()
    launch: tuple[ResourceRequest, ...] = ()
    wake_at: float | None = None


@dataclass
class _Ghosts:
    """The ghosts (FrameSpace: the bundles) of the current attempt, by index, and the node each runs on."""

    gang: Gang
    nodes: dict[int, str] = field(default_factory=dict)
    attempt: int = 0

    def started(self, index: int, node: str) -> Actions:
        """Ghost ``index`` runs on ``node``: one more unit of ``gang-<g>`` there (P4 locking)."""
        self.nodes[index] = node
        return Actions(deltas=((self.gang.resource, 1.0, node),))

    @property
    def complete(self) -> bool:
        return len(self.nodes) == len(self.gang.members)

    def teardown(self) -> Actions:
        """Delete ``gang-<g>`` wherever this attempt added to it and forget the attempt's ghosts: the one way
        a gang's resource goes, whether the attempt is rolled back or its members have finished."""
        nodes = sorted(set(self.nodes.values()))
        self.nodes.clear()
        return Actions(tuple(SetResource(self.gang.resource, 0.0, n) for n in nodes))

    def launch(self) -> tuple[ResourceRequest, ...]:
        return tuple(self.gang.member(i) for i in range(len(self.gang.members)))


class _GhostGang:
    """What AppSpace and LibSpace share: ghosts adding ``gang-<g>`` units, the launch once all of them run,
    and one rollback path, taken on a timeout (AppSpace) and when a running ghost dies (both): the ghosts
    go, ``gang-<g>`` is deleted, and the gang retries after ``_retry_delay()``."""

    gang: Gang
    _ghosts: _Ghosts
    done: bool
    _unlocks = False        # LibSpace hands the serializer back at launch

    @property
    def attempts(self) -> int:
        return self._ghosts.attempt + 1

    def on_ghost_started(self, now: float, index: int, node: str) -> GangStep:
        """Ghost ``index`` runs on ``node``: it adds its ``gang-<g>`` unit; the last one launches the members."""
        step = GangStep(actions=self._ghosts.started(index, node))
        if not self._ghosts.complete:
            return step
        self.done = True
        return replace(step, unlock=self._unlocks, launch=self._ghosts.launch())

    def on_ghost_lost(self, now: float, index: int) -> GangStep:
        """A running ghost died (its lease reclaimed with its holder, §4.3 heartbeats): roll back and retry.
        Once the members run they hold leases of their own, and the gang is left alone."""
        return GangStep() if self.done else self._rollback(now)

    def on_finished(self, now: float) -> GangStep:
        """Every member has ended: ``gang-<g>`` is deleted (the world ends the ghosts)."""
        return GangStep(actions=self._ghosts.teardown())

    def _rollback(self, now: float) -> GangStep:
        actions = self._ghosts.teardown()
        wake_at = now + self._retry_delay()
        self._ghosts.attempt += 1
        return GangStep(rollback=True, actions=actions, wake_at=wake_at)

    def _retry_delay(self) -> float:
        raise NotImplementedError


@dataclass
class AppSpaceGang(_GhostGang):
    """Ghosts + timeout + jittered exponential back-off, no coordination between gangs."""

    gang: Gang
    timeout: float = 5.0
    backoff: float = 0.1
    backoff_cap: float = 10.0
    jitter: float = 0.5
    seed: int = 0
    system: str = "escher"
    policy: str = "appspace"
    hooks: tuple[str, ...] = ("on_arrival",)

    def __post_init__(self) -> None:
        for name in ("timeout", "backoff", "backoff_cap"):
            positive(getattr(self, name), name)
        if not 0 <= self.jitter < 1:
            raise ConfigError("jitter", self.jitter, "must be in [0, 1)")
        self._rng = np.random.default_rng(self.seed)
        self._ghosts = _Ghosts(self.gang)
        self.done = False

    def on_arrival(self, now: float) -> GangStep:
        """Queue a ghost per member, with a timer for the rollback."""
        return GangStep(submit=tuple(range(len(self.gang.members))), wake_at=now + self.timeout)

    def on_timer(self, now: float) -> GangStep:
        """Timeout with ghosts missing: roll back (delete ``gang-<g>``) and retry after back-off."""
        return GangStep() if self.done else self._rollback(now)

    def on_retry(self, now: float) -> GangStep:
        return self.on_arrival(now)

    def _retry_delay(self) -> float:
        delay = min(self.backoff_cap, self.backoff * 2 ** self._ghosts.attempt)
        return delay * (1 + self.jitter * (2 * self._rng.random() - 1))


@dataclass
class LibSpaceGang(_GhostGang):
    """Ghosts serialized through the ``gang-lock`` mutex: no live-lock, no timeout, a lock round trip more."""

    gang: Gang
    system: str = "escher"
    policy: str = "libspace"
    hooks: tuple[str, ...] = ("on_arrival",)
    _unlocks = True

    def __post_init__(self) -> None:
        self._ghosts = _Ghosts(self.gang)
        self.done = False

    @staticmethod
    def setup(node: str) -> Actions:
        """The shared serializer: ``gang-lock`` with capacity 1 on one node (created once per cluster)."""
        return Actions((SetResource(LOCK, 1.0, node),))

    @staticmethod
    def lock_request(gang_id: str) -> ResourceRequest:
        return ResourceRequest(resources={LOCK: 1.0}, label=f"lock-{gang_id}")

    def on_arrival(self, now: float) -> GangStep:
        return GangStep(lock=True)

    def on_locked(self, now: float) -> GangStep:
        return GangStep(submit=tuple(range(len(self.gang.members))))

    def on_retry(self, now: float) -> GangStep:
        """After a dead ghost's rollback: the lock is still held, so queue the ghosts again at once."""
        return self.on_locked(now)

    def _retry_delay(self) -> float:
        return 0.0


@dataclass
class FrameSpaceGang:
    """All bundles in one ledger transaction (``grant_all``), retried by the world whenever capacity frees."""

    gang: Gang
    system: str = "escher"
    policy: str = "framespace"
    hooks: tuple[str, ...] = ("on_arrival",)

    def __post_init__(self) -> None:
        self._bundles = _Ghosts(self.gang)
        self.done = False
        self.attempts = 1

    def on_arrival(self, now: float) -> GangStep:
        return GangStep(grant_all=True)

    def on_granted(self, now: float, nodes: tuple[str, ...]) -> GangStep:
        """Every bundle is held: create ``gang-<g>`` where they landed and launch the members."""
        self.done = True
        deltas = tuple(d for i, n in enumerate(nodes) for d in self._bundles.started(i, n).deltas)
        return GangStep(actions=Actions(deltas=deltas), launch=self._bundles.launch())

    def on_finished(self, now: float) -> GangStep:
        """Every member has ended: ``gang-<g>`` is deleted (the world releases the bundles)."""
        return GangStep(actions=self._bundles.teardown())


GANG_DESIGNS = {"appspace": AppSpaceGang, "libspace": LibSpaceGang, "framespace": FrameSpaceGang}
"""The three designs of Fig. 4.7 by name."""
