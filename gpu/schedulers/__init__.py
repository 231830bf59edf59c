"""Schedulers: pure policies that turn a snapshot of the cluster into a decision."""
