"""Hyperparameter tuning algorithms that hand out TrialGroups for FLUID to execute (thesis §3.3.2).

The algorithms decide *what* to train (configs, budgets, promotions); ``gpu.schedulers.fluid.executor``
decides *how* (GPU fractions and counts). Nothing here imports Ray at module load: grid/random variants
use Ray Tune's variant generator inside functions only.
"""

from gpu.tuning.asha import ASHA
from gpu.tuning.base import ConfigSampler, RandomSampler, Result, TuningAlgorithm
from gpu.tuning.bohb import BOHB, KDESampler, SyncBOHB
from gpu.tuning.grid import FixedTrials, GridSearch, RandomSearch
from gpu.tuning.hyperband import Hyperband, SuccessiveHalving
from gpu.tuning.pbt import PBT
from gpu.tuning.space import Choice, Grid, LogUniform, Uniform, parse_space

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
