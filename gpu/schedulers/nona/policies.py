"""Nona's policy and the schemes it is compared with (§IV-A), by name: what ``gpuflows simulate nona --policy`` runs
and a ``SchedulerPolicy(system="nona")`` takes.

* ``nona`` — θ solved for the scenario's rates and link (``optimizer.solve``), sampled per query;
* ``nona_star`` — θ solved once at one load and link speed, reused;
* ``nona_table`` — ``NonaController`` with a lookup table of θ, re-chosen every epoch from measured rates (§III-A);
* ``expert``, ``opportunistic``, ``random``, ``undistributed`` — the baselines of ``baselines``;
* ``spark`` — Spark's fair scheduler on live state (the simulator's ``gpu.sim.nona.engine``).
"""

POLICIES = ("nona", "nona_star", "nona_table", "expert", "opportunistic", "random", "spark", "undistributed")
