"""FLUID (Salus/FLUID thesis, ch. 3): TrialGroups of hyperparameter trials on a GPU pool.

Scheduler modules:

- ``algorithms``: FLUID: how wide each trial of a TrialGroup runs (Yu, PhD thesis 2022, Ch
- ``baselines``: The executions FLUID is compared with (thesis §3.2.2, §3.6.1): one trial per GPU
- ``controller``: ``FluidExecutor``, FLUID's executor: StaticFluid/DynamicFluid widths → placements on concrete GPUs
  (thesis §3.3.3)
- ``policies``: The execution policies FLUID is evaluated against (thesis §3.6.1), by name, for the simulator and
  the flow
- ``session``: One hyperparameter-tuning job under FLUID: the loop of thesis Fig
- ``system``: FLUID's entry in the system registry (``gpu.systems``)
- ``tuning``: the hyperparameter tuning algorithms that hand out TrialGroups (grid, random, Hyperband, ASHA, BOHB,
  PBT; thesis §3.3.2)
"""
