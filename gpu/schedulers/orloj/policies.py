"""ORLOJ and the baselines of its evaluation (thesis §4.5), by name: what ``gpuflows simulate orloj --policy`` runs
and a ``SchedulerPolicy(system="orloj")`` takes.

* ``orloj`` — distribution-aware batching, Algorithm 4.1 (``policy.OrlojPolicy``);
* ``clockwork`` — Clockwork-like predictive planning on a point estimate (``baselines.ClockworkLike``);
* ``nexus`` — Nexus's early drop with the plan's batch size (the batch registry's ``early_drop``);
* ``clipper`` — Clipper-like AIMD batch sizing (``baselines.ClipperLike``).

A serving worker builds the same policies through the batch-policy registry (``gpu.systems.make_batch_policy``),
where ORLOJ's entry (``system.py``) declares ``orloj``, ``clockwork`` and ``clipper``.
"""

POLICIES = ("orloj", "clockwork", "nexus", "clipper")
