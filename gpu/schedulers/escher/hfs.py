"""Hierarchical max-min fair sharing as an ESL (ESCHER §4.4f, Fig. 4.5c).

The ESL owns a *domain* of nodes and one call, ``create_user(id, weight)``, returning the resource
``res-<id>`` the user's tasks request (one unit each, plus their physical needs). Sharing is done by
where that resource exists: a user's share is the set of nodes carrying its resource, created with
unbounded capacity, so physical resources bound the user's concurrency on them. Each round the ESL
water-fills its domain over the users' demands in proportion to their weights ("temporarily
re-allocate idle resources to oversubscribed users") and moves resources between nodes. Hierarchy is
"launching multiple instances of the ESL and restricting their operating domain to the nodes granted
by the parent": ``create_team`` returns a child ESL whose domain this one sets every round.

Choices where the paper is silent: the unit is a whole node; demand is what the world reports
(nodes' worth of pending + running tasks); rounding is largest-remainder; a user keeps the nodes it
had when its share allows (few moves), the nodes its tasks run on first, so a shrinking share gives up
its idle nodes; taking a node away removes the resource but never preempts the tasks on it, so a new
user ramps up as they finish (the dip at t=60 in Fig. 4.5c).

``FairShareMonitor`` is the ESL's loop ("an HFS ESL tracks idle resources and reallocates resources between
teams or users", §4.6): every period of its world's clock it rebalances on the demand the world observed, so
the simulator (``gpu.sim.escher.workloads.fair_share``) and the flow (``tasks/escher/fair_share.py``) drive
the same object.

Example (Fig. 4.5c): ``root`` with teams ``org1`` (A:B = 2:3) and ``org2`` (C), equal weights, 100
nodes: A alone gets 100; with B, A 40 and B 60; with C too, A 20, B 30, C 50.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from gpu.errors import ConfigError
from gpu.schedulers.escher.api import UNBOUNDED, Actions, SetResource, largest_remainder
from gpu.scenario import positive


def water_fill(total: int, weights: Sequence[float], demands: Sequence[float]) -> list[int]:
    """Weighted max-min fair split of ``total`` whole units under ``demands`` (each gets at most its demand;
    what a satisfied member leaves goes to the others in proportion to their weights)."""
    share = [0.0] * len(weights)
    active = [i for i in range(len(weights)) if demands[i] > 0]
    left = float(total)
    while active and left > 1e-9:
        wsum = sum(weights[i] for i in active)
        grant = {i: left * weights[i] / wsum for i in active}
        capped = [i for i in active if share[i] + grant[i] >= demands[i] - 1e-9]
        if not capped:
            for i in active:
                share[i] += grant[i]
            break
        for i in capped:
            left -= demands[i] - share[i]
            share[i] = demands[i]
        active = [i for i in active if i not in capped]
    whole = [min(math.floor(s + 1e-9), int(demands[i])) for i, s in enumerate(share)]
    spare = min(total, int(sum(min(s, d) for s, d in zip(share, demands)) + 1e-9)) - sum(whole)
    room = [i for i in range(len(weights)) if whole[i] < demands[i]]
    for i, extra in zip(room, largest_remainder(max(spare, 0), [share[i] - whole[i] for i in room])):
        whole[i] += extra
    return whole


@dataclass
class _Member:
    weight: float
    team: "HierarchicalFairShare | None" = None
    nodes: list[str] = field(default_factory=list)


@dataclass
class HierarchicalFairShare:
    """One HFS ESL instance over ``domain``; a ``gpu.contract.Controller`` answering ``on_round``."""

    domain: list[str] = field(default_factory=list)
    name: str = "root"
    system: str = "escher"
    policy: str = "hfs"
    hooks: tuple[str, ...] = ("on_round",)

    def __post_init__(self) -> None:
        self._members: dict[str, _Member] = {}

    def create_user(self, user_id: str, weight: float = 1.0) -> str:
        """Register a user; returns the resource its tasks request one unit of."""
        self._add(user_id, weight, None)
        return f"res-{user_id}"

    def create_team(self, team_id: str, weight: float = 1.0) -> "HierarchicalFairShare":
        """A child ESL sharing out whatever part of this domain ``team_id`` is granted."""
        team = HierarchicalFairShare([], team_id)
        self._add(team_id, weight, team)
        return team

    def _add(self, member_id: str, weight: float, team: "HierarchicalFairShare | None") -> None:
        if not isinstance(member_id, str) or not member_id:
            raise ConfigError("user id", member_id, "must be a non-empty string")
        if member_id in self._members:
            raise ConfigError("user id", member_id, f"already in {self.name}")
        self._members[member_id] = _Member(positive(weight, f"weights[{member_id!r}]"), team)

    def demand(self, demands: Mapping[str, float]) -> float:
        """Nodes this ESL could use: its members' demands (a team's summed), capped by nothing."""
        return sum(m.team.demand(demands) if m.team else max(0.0, float(demands.get(i, 0)))
                   for i, m in self._members.items())

    def shares(self) -> dict[str, list[str]]:
        """user -> nodes carrying its resource, over the whole hierarchy below this ESL."""
        out: dict[str, list[str]] = {}
        for i, m in self._members.items():
            out.update(m.team.shares() if m.team else {i: list(m.nodes)})
        return out

    def on_round(self, now: float, demands: Mapping[str, float],
                 running: Mapping[str, Collection[str]] | None = None) -> Actions:
        """Rebalance: water-fill the domain over the members, move nodes, recurse into teams.

        ``demands``: user -> nodes' worth of work (pending + running). ``running``: user -> the nodes its
        tasks run on now; a user losing nodes keeps those and gives up its idle ones, so what it gives up
        is usable at once. Returns the ``set_resource`` calls that make the users' resources match their
        new shares.
        """
        for user, d in demands.items():
            if not isinstance(d, (int, float)) or isinstance(d, bool) or not math.isfinite(d) or d < 0:
                raise ConfigError(f"demands[{user!r}]", d, "must be a finite number >= 0")
        before = self.shares()
        self._busy_first(running or {})
        self._rebalance(demands)
        return Actions(tuple(_diff(before, self.shares())))

    def _busy_first(self, running: Mapping[str, Collection[str]]) -> None:
        """Order every user's nodes so the ones running its tasks come first (kept first when it shrinks)."""
        for i, m in self._members.items():
            if m.team is not None:
                m.team._busy_first(running)
            else:
                busy = set(running.get(i, ()))
                m.nodes.sort(key=lambda n: n not in busy)

    def _counts(self, nodes: int, demands: Mapping[str, float]) -> dict[str, int]:
        ids = list(self._members)
        want = [self._members[i].team.demand(demands) if self._members[i].team else float(demands.get(i, 0))
                for i in ids]
        return dict(zip(ids, water_fill(nodes, [self._members[i].weight for i in ids], want)))

    def _keep_first(self, count: int, demands: Mapping[str, float]) -> list[str]:
        """This team's nodes, the ``count`` its members would keep first: a shrinking team gives up the
        nodes its members lose anyway, so a member that keeps its share keeps its (warm) nodes."""
        kept, rest = [], []
        for i, n in self._counts(count, demands).items():
            m = self._members[i]
            mine = m.team._keep_first(n, demands) if m.team else m.nodes
            kept += mine[:n]
            rest += mine[n:]
        return kept + rest + [n for n in self.domain if n not in kept and n not in rest]

    def _rebalance(self, demands: Mapping[str, float]) -> None:
        counts = self._counts(len(self.domain), demands)
        for i, m in self._members.items():
            if m.team is not None:
                m.nodes = [n for n in m.team._keep_first(counts[i], demands) if n in m.nodes]
        self._assign(counts)
        for m in self._members.values():
            if m.team is not None:
                m.team.domain = list(m.nodes)
                m.team._rebalance(demands)

    def _assign(self, counts: Mapping[str, int]) -> None:
        """Give each member ``counts[i]`` nodes of the domain, keeping the ones it has where it can."""
        domain = set(self.domain)
        free = [n for n in self.domain]
        for i, m in self._members.items():
            m.nodes = [n for n in m.nodes if n in domain][: counts[i]]
            for n in m.nodes:
                free.remove(n)
        for i, m in self._members.items():
            while len(m.nodes) < counts[i] and free:
                m.nodes.append(free.pop(0))


@dataclass(frozen=True)
class Rebalance:
    """One period's decision: the ``set_resource`` calls, every user's nodes after them, and when to look again."""

    actions: Actions
    shares: Mapping[str, tuple[str, ...]]
    wake_at: float


@dataclass
class FairShareMonitor:
    """The HFS ESL's monitor (§4.6, Fig. 4.5c): every ``period_s`` of the world's clock it re-divides the nodes
    over the demand the world observed, each user's tasks queued or running. A user whose work ended thus hands
    its idle nodes on at the next period, and a user that starts submitting gets its share at the next period,
    whichever clock drives it (the simulator's event loop, the flow's wall clock). A ``gpu.contract.Controller``."""

    root: HierarchicalFairShare
    period_s: float = 5.0
    system: str = "escher"
    policy: str = "hfs"
    hooks: tuple[str, ...] = ("on_wake",)

    def __post_init__(self) -> None:
        positive(self.period_s, "period_s")

    def on_wake(self, now: float, demands: Mapping[str, float],
                running: Mapping[str, Collection[str]] | None = None) -> Rebalance:
        """Rebalance on ``demands`` (user -> tasks queued or running) and ``running`` (user -> nodes its tasks
        run on); wake again one period later."""
        actions = self.root.on_round(now, demands, running)
        return Rebalance(actions, {u: tuple(n) for u, n in self.root.shares().items()}, now + self.period_s)


def _diff(before: Mapping[str, list[str]], after: Mapping[str, list[str]]) -> list[SetResource]:
    """The calls that turn ``before`` into ``after`` (deletions first: a node changes hands)."""
    gone = [SetResource(f"res-{u}", 0.0, n) for u, nodes in before.items() for n in nodes if n not in after.get(u, [])]
    new = [SetResource(f"res-{u}", UNBOUNDED, n) for u, nodes in after.items() for n in nodes if n not in before.get(u, [])]
    return gone + new
