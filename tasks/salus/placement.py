"""A Salus job's lane as its task's placement carries it (thesis Alg. 2.1, Fig. 2.3).

The runner names no system: what a Salus executor gave a job travels as the placement's opaque ``admission``
payload (``tasks.runtime.requests.TaskPlacement``; to worker processes in their env), written by
``tasks.salus.admission.SalusAdmission.payload`` and read back here. Its ``memory_cap`` key is also what the
placement's generic ``memory_cap`` reports: the job's lane budget ``P + L_lane``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from tasks.runtime.requests import TaskPlacement, current_placement

@dataclass(frozen=True)
class Lane:
    """The Salus memory lane a task was admitted into (``tasks.salus.executor``).

    ``memory_cap``: bytes the job may use, its persistent memory plus the lane's size (``P + L_lane``);
    ``token``: address of the device executor's iteration-token service (a Unix socket path);
    ``profile_iterations``: iterations to measure before the job is re-admitted with its measured memory
    (0: it declared its memory; otherwise it was admitted alone on the device to be profiled);
    ``host_pid``: the executor's process. A job running there (the runner's thread mode) shares one CUDA allocator
    with every other job of the process, and ``torch.cuda.set_per_process_memory_fraction`` caps the process, not
    the job: such a job is not capped (``tasks.salus.executor.salus_iterations``); only a job in a worker process
    of its own is.
    """

    lane_id: int
    job_id: str
    memory_cap: int
    token: str
    profile_iterations: int = 0
    host_pid: int = 0

    def payload(self) -> dict[str, Any]:
        """The lane as a placement's ``admission`` payload (JSON)."""
        return asdict(self)


_LANE_FIELDS = frozenset(f.name for f in fields(Lane))

def placement_lane(placement: TaskPlacement | None) -> Lane | None:
    """The lane in ``placement``'s admission payload; None for a task no Salus executor admitted into a lane."""
    payload = placement.admission if placement is not None else None
    if not payload or set(payload) != _LANE_FIELDS:
        return None
    return Lane(**payload)


def current_lane() -> Lane | None:
    """The lane of the task running now (None outside a Salus lane)."""
    return placement_lane(current_placement())
