"""The ``gpuflows`` command line; the engine is the ``gpu`` package, the Prefect shells are ``flows``/``tasks``."""
