"""The runner's admission seam: how a system places tasks into something a holder other than the task leases.

By default ``GpuTaskRunner`` gives each task its own lease from the pool ledger. Some systems instead keep a
device (or part of one) for longer than a task and admit tasks into it: a Salus executor leases a device whole
and admits jobs into its memory lanes (``tasks.salus.admission``). The runner names no such system: a flow
passes an *admission* (``GpuTaskRunner(pool, admission=SalusColocation(policy="fair"))``, or ``admission`` in
the settings its ``configure=`` hook returns), and the runner's acquire/release path asks it, task by task,
whether it admits the task or the task takes a plain lease.

Two objects, because a runner is a configuration value (compared, duplicated and pickled into every worker
process, ``PlacingTaskRunner._config``) while admitting holds live state (executors, sockets, threads):

* an ``Admission`` is a setting: frozen, picklable, comparable, checked when made (a bad field is one
  ``ConfigError`` naming it). ``open`` builds its ``Admitter`` once per runner, on first use.
* an ``Admitter`` is that state for one runner's life: it admits and releases tasks and is closed with the
  runner's backend.

Prefect keeps each execution backend a sibling subclass of one small ``TaskRunner`` base; Ray Tune keeps a trial
scheduler's decisions apart from the executor that runs the trials. Likewise here: the admission never touches
the runner's internals, and the runner never knows which system admitted a task. What a task needs to know
about its admission (a Salus job: its lane) travels as the placement's opaque ``admission`` payload
(``tasks.runtime.requests.TaskPlacement``), read by the system's own helper.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from gpu.ledger import LedgerClient, Lease
from gpu.placement import ResourceRequest


@dataclass(frozen=True)
class AdmissionHost:
    """What the runner lends its admitter: the pool's ledger (opened on first call), how long a task may wait
    for room, and whom to tell when an admitted task's placement is taken away (``on_lost(placement id, why)``:
    the runner fails the task holding it and stops it)."""

    ledger: Callable[[], LedgerClient]
    allocation_timeout: float | None
    on_lost: Callable[[str, str], Any]


@runtime_checkable
class Admitter(Protocol):
    """One runner's live admission (see the module docstring). Every method is called from the runner's
    dispatcher threads, so an admitter is thread-safe."""

    def check(self, task: Any, request: ResourceRequest) -> None:
        """At submission, in the flow: raise ConfigError or NeverFitsError naming the task for a task this
        admission could never place (one error before any work)."""

    def ledger_request(self, task: Any, request: ResourceRequest) -> ResourceRequest | None:
        """The plain ledger lease the task takes (``request``, or a narrower one), or None when this admission
        places the task itself (``acquire``)."""

    def acquire(self, task: Any, request: ResourceRequest, cancel_event: threading.Event) -> Lease:
        """Wait until the task is admitted (or ``cancel_event`` is set: raise InterruptedError); its placement,
        whose ``lease_id`` is the task's own."""

    def holds(self, placement: Lease) -> bool:
        """Whether this admission placed ``placement`` (else it is a plain ledger lease)."""

    def payload(self, placement: Lease) -> Mapping[str, Any] | None:
        """What the admitted task needs to know about its admission, JSON-serialisable (it travels to worker
        processes in the placement's env); None for a task it did not place. An optional ``memory_cap`` (bytes)
        is the task's memory budget (``TaskPlacement.memory_cap``)."""

    def release(self, placement: Lease) -> str | None:
        """The task ended (whatever way): free what it was admitted to. Returns why the task must not be trusted
        when what held its placement went away meanwhile (the runner then ends it Crashed), else None."""

    def close(self) -> None:
        """Give back everything held (after every task has been released)."""


@runtime_checkable
class Admission(Protocol):
    """A runner setting: frozen, picklable and comparable (a runner's equality and pickling include it)."""

    name: str
    """The system admitting, e.g. ``"salus"`` (in the runner's log lines)."""

    def open(self, host: AdmissionHost) -> Admitter:
        """The live admitter for one runner (called once, on the runner's first use of it)."""

    def worker_processes(self, default: int) -> int:
        """Worker processes the runner keeps per set of visible devices, given its own ``workers_per_device_set``:
        at least as many as tasks this admission lets hold one device at once, so that an admitted task never
        waits for a process while holding what it was admitted to."""
