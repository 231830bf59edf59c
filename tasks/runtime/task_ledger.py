"""The pool ledger from inside a running task: ESCHER's ``set_resource`` (thesis §4.4, Listing 1, primitive P1).

A task placed by a GPU task runner knows its pool from its placement (``Lease.pool``): a ledger file of this
machine, or ``ray:<actor>`` for the Ray runner's ledger actor. Apart from ``tasks.runtime.requests`` (which
the runners themselves build on) because reaching the Ray ledger needs the Ray runner.
"""

from __future__ import annotations

from gpu.errors import ConfigError
from gpu.ledger import open_ledger
from tasks.runtime.ray_runner import RAY_POOL, attach
from tasks.runtime.requests import current_placement


def task_ledger():
    """The ledger of the pool the running task was placed by (its placement carries the pool's id):
    the runner's own in thread mode, the pool file from a worker process, the ledger actor on Ray."""
    tp = current_placement()
    if tp is None or not tp.placement.pool:
        raise ConfigError("placement", None, "set_resource needs a task placed by a GPU task runner")
    if tp.placement.pool.startswith(RAY_POOL):
        return attach(tp.placement.pool)
    return open_ledger(tp.placement.pool)


def set_resource(name: str, capacity: float, node: str | None = None) -> None:
    """ESCHER's ``set_resource`` from inside a task: ``node=None`` is the task's own node (ESCHER
    Listing 1, primitive P1), unlike the ledger's ``set_resource`` where None means every node."""
    tp = current_placement()
    task_ledger().set_resource(name, capacity, node or (tp.placement.node if tp else None))
