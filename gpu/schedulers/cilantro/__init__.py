"""Cilantro: performance-aware allocation for general objectives via online feedback (thesis ch. 3).

Scheduler modules:

- ``allocation``: resource granularity and the round's allocation space 𝒜^(r) (§3.4)
- ``controller``: ``CilantroRound``, the allocation round as one controller for the simulator and the flow
- ``demand_mmf``: Cilantro-NJC, max-min fairness on learned demands (§3.4, eqs. 3.5–3.6)
- ``ernest``, ``quasar``, ``minerva``, ``greedy``, ``reactive``: the baselines of §3.7, adapted to demand learning
- ``evolutionary``: evolutionary welfare search (EvoAlg-SW/-EW)
- ``fair``: demand-based max-min fairness and Resource-Fair
- ``forecasters``: load forecasters, an upper confidence bound on the next round's load (§3.3, §3.6)
- ``learners``: performance learners with confidence intervals (§3.3, §3.6)
- ``metrics``: utilities and the welfare/fairness metrics (eqs. 3.1–3.3, 3.8)
- ``microservices``: microservice allocation by OFU on one end-to-end signal (eq. 3.7, Fig. 3.12)
- ``policies``: ``POLICIES``, the paper's policy names (Table 3.2) → factories, and ``make_policy``
- ``system``: Cilantro's entry in the system registry (``gpu.systems``)
- ``types``: the snapshot a policy decides from, and the policy contract (§3.3, Fig. 3.3)
- ``welfare``: welfare policies by optimism in the face of uncertainty (§3.4, eq. 3.4)
"""
