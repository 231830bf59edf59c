"""Nexus (Shen et al., SOSP 2019): squishy bin packing, epochs, routing and query chaining.

Scheduler modules:

- ``batching``: the dispatch batch policies, early drop (§6.3) and the lazy-drop and fixed-batch baselines
- ``chaining``: Query DAGs served as DAGs: which requests a finished stage request issues to the next stages, due
  when
- ``controller``: The Nexus controller: epoch scheduling, routing and query chaining, driven by a simulator or a
  serving flow
- ``epoch``: Epoch-based re-planning: when to re-run squishy bin packing and how to keep the previous placement
- ``overflow``: Route a capped plan's unassigned load onto GPUs: admission is the dispatcher's job, not the plan's
- ``policies``: ``POLICIES``, the serving configurations ``gpuflows simulate nexus --policy`` and the controller
  choose between
- ``prefix``: Prefix batching: specialised model variants that share a prefix are batched together in the prefix
- ``profiles``: Batching profiles ℓ(b) for Nexus and the latency rules the scheduler evaluates on them
- ``query``: Complex-query SLO split: how a query's end-to-end SLO is divided among the models of its dataflow
- ``routing``: How a Nexus frontend spreads one session's requests over the GPUs that host it
- ``squishy``: Nexus squishy bin packing: which model sessions run on which GPU, at what batch and duty cycle
- ``synthetic``: Synthetic linear batching profiles for the paper's models, built from the paper's anchors
  (inferred)
- ``system``: Nexus's entry in the system registry (``gpu.systems``)
"""
