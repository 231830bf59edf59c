"""Which simulator serves ``gpuflows simulate <system>``.

Each entry is ``"module:function"``, imported lazily so the CLI starts fast. The function has
the signature ``run(scenario_path: str, policies: list[str] | None) -> gpu.report.SimulationReport``
and raises ``gpu.errors.ConfigError`` for bad input.
"""

SIMULATORS: dict[str, str] = {
    "ekya": "gpu.sim.ekya:run",
    "fluid": "gpu.sim.fluid:run",
    "cilantro": "gpu.sim.cilantro:run",
    "nexus": "gpu.sim.nexus:run",
    "nona": "gpu.sim.nona:run",
}
