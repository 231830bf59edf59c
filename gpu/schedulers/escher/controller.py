"""The ESCHER controller the system registry checks against ``gpu.contract``: hierarchical fair sharing.

ESCHER has no single decision loop: each scheduling policy is its own ESL over the pool ledger (§4.4), one module
each (``gang``, ``hfs``, ``soft``, ``primitives``, ``tune``). The one that answers a world's rounds is
:class:`HierarchicalFairShare` (§4.4f, Fig. 4.5c); it stays in ``hfs.py`` beside the ESL it is, with
``FairShareMonitor``, the loop through which the simulator's ``hfs`` experiment and the flow's fair-share demo
both call it every period.
"""

from gpu.schedulers.escher.hfs import HierarchicalFairShare

__all__ = ["HierarchicalFairShare"]
