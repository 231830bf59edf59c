"""Salus on real devices (thesis ch. 2): per-device executors with memory lanes, admission, profiling, traces."""
