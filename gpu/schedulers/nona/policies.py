"""Nona's policy and the schemes it is compared with (§IV-A), by name: what ``gpuflows simulate nona --policy`` runs
and a ``SchedulerPolicy(system="nona")`` takes.

* ``nona`` — θ solved for the scenario's rates and link (``optimizer.solve``), sampled per query;
* ``nona_star`` — θ solved once at one load and link speed, reused;
* ``nona_table`` — ``NonaController`` with a lookup table of θ, re-chosen every epoch from measured rates (§III-A);
* ``expert``, ``opportunistic``, ``random``, ``undistributed`` — the baselines of ``baselines``;
* ``spark`` — Spark's fair scheduler on live state (the simulator's ``gpu.sim.nona.engine``);
* ``sjf_cp`` — a Decima-style list scheduler on live state (shortest job first, critical path within a job), in
  place of Decima, whose trained model is not available.
"""

POLICIES = ("nona", "nona_star", "nona_table", "expert", "opportunistic", "random", "spark", "sjf_cp",
            "undistributed")
