"""Salus on real devices (thesis ch. 2): per-device executors with memory lanes, the runner's Salus admission, a job's
lane in its placement, profiling, traces, and the sharing flow's records and chart."""
