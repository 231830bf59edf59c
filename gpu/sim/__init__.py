"""Discrete-event simulation: one clock (``events.EventLoop``) shared by every system's simulator."""
