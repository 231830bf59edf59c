"""Microservice allocation by OFU on one end-to-end signal (thesis ch. 3, §3.4 "Microservices", eq. 3.7; §3.7 Fig. 3.12).

One application of ``n`` services; its end-to-end P99 latency is learned directly as a function of
the whole allocation and the load (no dependency graph needed by the policy): a Gaussian process
with an additive Matérn-5/2 kernel over (load, one service's share) pairs (text: kernel ridge
regression with Matérn 2.5; the code: a GP with an additive Matérn kernel and ``UCB = μ + 2.5σ``) on ``[ℓ / ℓ_ref, a / (R/n)]``, label ``−log P99``. Cilantro maximises the UCB
with the evolutionary search of :mod:`.evolutionary`. Baselines (§3.7): Resource-Fair; EvoAlg (the
search on *observed* P99, one proposal per round); ε-greedy (explore a random split w.p. 1/3, else
the best split seen).

:class:`ServiceGraph` is the simulated ground truth (DeathStarBench Hotel Reservation's 19 services,
thesis §3.7): each request type is a chain of services; a service with work ``w`` (CPU-s per visit),
visit rate ``λ`` and ``c`` CPUs has mean latency ``w / (1 − ρ)``, ``ρ = λw/c`` (saturated: a steep
penalty), and the P99 is ``ln 100 ×`` the slowest request type's mean (exponential tails).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from gpu.errors import ConfigError
from gpu.schedulers.cilantro.evolutionary import _split, evolve, mutate

HOTEL_SERVICES = ("consul", "frontend", "geo", "jaeger", "memcached-profile", "memcached-rate", "memcached-reserve",
                  "mongodb-geo", "mongodb-profile", "mongodb-rate", "mongodb-recommendation", "mongodb-reservation",
                  "mongodb-user", "profile", "rate", "recommendation", "reservation", "search", "user")
# request type: (share of requests, services visited); consul/jaeger/frontend see every request
HOTEL_REQUESTS = (
    (0.6, ("search", "geo", "mongodb-geo", "rate", "memcached-rate", "mongodb-rate", "profile", "memcached-profile")),
    (0.39, ("recommendation", "mongodb-recommendation", "profile", "memcached-profile", "mongodb-profile")),
    (0.005, ("user", "mongodb-user")),
    (0.005, ("user", "mongodb-user", "reservation", "memcached-reserve", "mongodb-reservation")),
)


@dataclass(frozen=True, eq=False)
class ServiceGraph:
    """Ground-truth latency model: ``p99(alloc, load)`` in seconds for a batch of allocations."""

    services: tuple[str, ...]
    work: np.ndarray          # CPU-seconds per visit
    visits: np.ndarray        # request types × services: visits per request
    shares: np.ndarray        # request-type mix

    def p99(self, alloc: np.ndarray, load: float) -> np.ndarray:
        a = np.atleast_2d(np.asarray(alloc, dtype=float))
        rate = load * (self.shares @ self.visits)                    # visits/s per service
        rho = rate * self.work / np.maximum(a, 1e-9)
        lat = np.where(rho < 0.95, self.work / (1 - np.minimum(rho, 0.95)), self.work * 20 * (1 + 10 * (rho - 0.95)))
        per_type = lat @ self.visits.T                              # batch × request types
        return math.log(100) * per_type.max(axis=1)


def hotel_reservation(rng: np.random.Generator | None = None) -> ServiceGraph:
    """The 19-service Hotel Reservation graph with seeded per-service work (ms scale)."""
    rng = rng or np.random.default_rng(0)
    idx = {s: i for i, s in enumerate(HOTEL_SERVICES)}
    visits = np.zeros((len(HOTEL_REQUESTS), len(HOTEL_SERVICES)))
    for t, (_, chain) in enumerate(HOTEL_REQUESTS):
        for s in ("consul", "jaeger", "frontend", *chain):
            visits[t, idx[s]] += 1
    work = np.array([(0.012 if s.startswith("mongodb") else 0.002 if s.startswith("memcached") else 0.006)
                     for s in HOTEL_SERVICES]) * rng.uniform(0.6, 1.4, len(HOTEL_SERVICES))
    return ServiceGraph(HOTEL_SERVICES, work, visits, np.array([s for s, _ in HOTEL_REQUESTS]))


class MaternGP:
    """GP regression with a Matérn-5/2 kernel and fixed hyper-parameters; ``ucb = μ + κσ``."""

    def __init__(self, length_scale: float = 1.0, noise: float = 0.1, kappa: float = 2.5):
        self.length_scale, self.noise, self.kappa = length_scale, noise, kappa
        self.x: list[list[float]] = []
        self.y: list[float] = []
        self._fit: tuple | None = None  # cached Cholesky factor, cleared by update()

    def _k(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Additive kernel: mean over services of a Matérn-5/2 on (load, that service's share)."""
        out = np.zeros((len(a), len(b)))
        for i in range(1, a.shape[1]):
            sq = (a[:, None, 0] - b[None, :, 0]) ** 2 + (a[:, None, i] - b[None, :, i]) ** 2
            d = np.sqrt(sq) * math.sqrt(5) / self.length_scale
            out += (1 + d + d**2 / 3) * np.exp(-d)
        return out / (a.shape[1] - 1)

    def update(self, x: np.ndarray, y: float) -> None:
        self.x.append([float(v) for v in x])
        self.y.append(float(y))
        self._fit = None

    def ucb(self, xq: np.ndarray) -> np.ndarray:
        if not self.y:
            return np.full(len(xq), np.inf)
        if self._fit is None:
            x, y = np.array(self.x), np.array(self.y)
            scale = y.std() + 1e-9  # standardised labels: unit prior variance
            fac = cho_factor(self._k(x, x) + self.noise**2 * np.eye(len(y)))
            self._fit = (x, y.mean(), scale, fac, cho_solve(fac, (y - y.mean()) / scale))
        x, mean_y, scale, fac, alpha = self._fit
        ks = self._k(xq, x)
        mu = ks @ alpha
        var = np.maximum(1.0 - np.einsum("ij,ji->i", ks, cho_solve(fac, ks.T)), 1e-12)
        return mean_y + scale * (mu + self.kappa * np.sqrt(var))

    def get_state(self) -> dict[str, Any]:
        return {"length_scale": self.length_scale, "noise": self.noise, "kappa": self.kappa, "x": self.x, "y": self.y}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["length_scale"], state["noise"], state["kappa"])
        self.x, self.y = [list(map(float, r)) for r in state["x"]], [float(v) for v in state["y"]]


@dataclass(frozen=True, eq=False)
class MicroserviceSnapshot:
    """One round: the pool, the load UCB, the optimistic objective and the observed history."""

    capacity: int
    n: int
    round_index: int
    objective_ucb: Callable[[np.ndarray], np.ndarray] | None
    history: tuple[tuple[tuple[int, ...], float], ...]  # (allocation, observed −P99)


def _equal(n: int, total: int) -> np.ndarray:
    return np.full(n, total // n) + (np.arange(n) < total % n)


class MicroservicePolicy:
    """``ms-cilantro`` (GP-UCB + evolution), ``ms-evoalg``, ``ms-egreedy`` or ``ms-resource-fair``."""

    KINDS = ("ms-cilantro", "ms-evoalg", "ms-egreedy", "ms-resource-fair")

    def __init__(self, name: str, iterations: int = 1000, epsilon: float = 1 / 3):
        if name not in self.KINDS:
            raise ConfigError("policy", name, f"unknown; choose one of {list(self.KINDS)}")
        self.name, self.iterations, self.epsilon = name, iterations, epsilon
        self.learner = "online" if name == "ms-cilantro" else "none"

    def decide(self, snap: MicroserviceSnapshot, rng: np.random.Generator) -> np.ndarray:
        n, total = snap.n, snap.capacity
        if self.name == "ms-resource-fair" or snap.round_index < 2:
            return _equal(n, total)
        if snap.round_index == 2 or not snap.history:
            return _split(rng.random((1, n)), total, 4)[0]
        allocs = np.array([a for a, _ in snap.history])
        vals = np.array([v for _, v in snap.history])
        if self.name == "ms-cilantro":
            return evolve(snap.objective_ucb, n, total, rng, iterations=self.iterations, min_units=4, parents=20,
                          seeds=allocs[np.argsort(vals)[-5:]])
        if self.name == "ms-egreedy":
            return _split(rng.random((1, n)), total, 3)[0] if rng.random() < self.epsilon else allocs[int(np.argmax(vals))]
        z = (vals - vals.mean()) / (vals.std() + 1e-12)
        p = np.exp(z - z.max())
        return mutate(allocs[rng.choice(len(vals), p=p / p.sum())], total, 3, rng)
