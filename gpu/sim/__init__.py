"""Discrete-event simulation: one clock (``events.EventLoop``) for the simulators whose events come at irregular
times (arrivals, completions, epochs: Ekya, FLUID, Nexus, Salus, ESCHER, ORLOJ, Nona). Cilantro's simulators step
round by round instead (``gpu.sim.cilantro.run``, ``.microservices``): the only event is the round boundary, every
``round_s`` on a fixed period, so a loop over rounds is the clock and a heap would never hold more than one event.

Each system's simulator is ``gpu.sim.<system>.run.run(scenario_path, policies)``, driving the same controller its
Prefect flow drives (``gpu.contract``) with modelled outcomes.
"""
