"""Cilantro's flow side (OSDI 2023): real jobs on their slices, the allocator, the rounds of a flow run, their records
and chart."""
