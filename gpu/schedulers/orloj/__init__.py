"""ORLOJ (thesis ch. 4): distribution-aware batching for dynamic DNNs.

Scheduler modules:

- ``baselines``: The baselines of ORLOJ's evaluation (thesis §4.5) as batch policies that assume data-independent
  latency: Clockwork-, Nexus- (fixed plan, duty cycle) and Clipper-like
- ``controller``: One GPU worker's batching loop as a ``gpu.contract.Controller``: queue, batch policy, feedback,
  profiler
- ``cost_model``: ``PaddedBatchModel``, a padded batch runs as long as its slowest request (Eq. 4.3/4.4)
- ``hull``: ORLOJ's priority queue as a dynamic upper envelope of lines (Yu 2022, §4.4.4, Fig
- ``policies``: ``POLICIES``, ORLOJ and the baselines of its evaluation (§4.5), by name
- ``policy``: ORLOJ: distribution-aware batching for dynamic DNNs (P
- ``queue``: ORLOJ's pending requests of one worker, kept as Algorithm 4.1 keeps them (§4.4.3–§4.4.4)
- ``profiler``: ORLOJ's online profiler (Yu 2022, §4.3.2): per-application alone times of sampled finished requests
- ``system``: ORLOJ's entry in the system registry (``gpu.systems``)
"""
