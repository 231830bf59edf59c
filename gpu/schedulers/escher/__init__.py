"""ESCHER (SoCC 2021): scheduling policies as libraries over ephemeral resources.

Scheduler modules:

- ``api``: ESCHER: scheduling policies as ephemeral resources over the pool ledger
- ``controller``: the controller the registry checks, ``HierarchicalFairShare`` (``hfs``)
- ``effort``: the lines of code a policy costs, counted as §4.5 counts effort
- ``gang``: Gang scheduling as ESCHER writes it (§4.4e, Table 4.2 "Gang", Fig
- ``hfs``: Hierarchical max-min fair sharing as an ESL and its every-period monitor (ESCHER §4.4f, Fig
- ``policies``: ``POLICIES``, ESCHER's experiments and demos by name
- ``primitives``: ESCHER's primitives P1–P4 (§4.4) and the Table 4.2 policies built from them, as ESL calls
- ``soft``: Soft constraints, OR-composition and conflict relaxation as an ESL (ESCHER §4.4g–h, Fig
- ``system``: ESCHER's entry in the system registry (``gpu.systems``)
- ``trials``: where a FLUID trial's data-parallel workers go on a pool of nodes (anti-affinity, then affinity)
- ``tune``: EscherTune's ESL (§4.5, Fig. 4.6c): where a trial's workers start, when a spread trial is consolidated,
  and the move
"""
