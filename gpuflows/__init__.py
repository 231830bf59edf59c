"""The ``gpuflows`` command line; the engine is the ``gpu`` package, the Prefect shells are ``flows``/``tasks``."""

from gpu.state import default_prefect_home

default_prefect_home()  # a script importing tasks/gpuflows before Prefect: its runs land where `make server` looks
