"""FLUID's flow side (thesis ch. 3): trials on the pool, the profiler, packing, and trials as Salus jobs or ESCHER gangs."""
