"""Hyperparameter tuning algorithms that hand out TrialGroups for FLUID to execute (thesis §3.3.2).

The algorithms decide *what* to train (configs, budgets, promotions); ``gpu.schedulers.fluid.controller``
decides *how* (GPU fractions and counts). Nothing here imports Ray at module load: grid/random variants
use Ray Tune's variant generator inside functions only.
"""

from gpu.schedulers.fluid.tuning.asha import ASHA
from gpu.schedulers.fluid.tuning.base import ConfigSampler, RandomSampler, Result, TuningAlgorithm
from gpu.schedulers.fluid.tuning.bohb import BOHB, KDESampler, SyncBOHB
from gpu.schedulers.fluid.tuning.grid import FixedTrials, GridSearch, RandomSearch
from gpu.schedulers.fluid.tuning.hyperband import Hyperband, SuccessiveHalving
from gpu.schedulers.fluid.tuning.pbt import PBT
from gpu.schedulers.fluid.tuning.space import Choice, Grid, LogUniform, Uniform, parse_space

ALGORITHMS: dict[str, type[TuningAlgorithm]] = {
    "grid": GridSearch,
    "random": RandomSearch,
    "sh": SuccessiveHalving,
    "hyperband": Hyperband,
    "asha": ASHA,
    "syncbohb": SyncBOHB,
    "bohb": BOHB,
    "pbt": PBT,
}

__all__ = [
    "ALGORITHMS", "ASHA", "BOHB", "Choice", "ConfigSampler", "FixedTrials", "Grid", "GridSearch", "Hyperband",
    "KDESampler", "LogUniform", "PBT", "RandomSampler", "RandomSearch", "Result", "SuccessiveHalving", "SyncBOHB",
    "TuningAlgorithm", "Uniform", "parse_space",
]
