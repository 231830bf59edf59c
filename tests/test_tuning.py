"""Tuning algorithms hand out valid TrialGroups, stop within their budget and learn from scores."""

import subprocess
import sys

import numpy as np
import pytest

from gpu.errors import ConfigError
from gpu.schedulers.fluid.tuning import (ASHA, BOHB, PBT, Choice, Grid, GridSearch, Hyperband, KDESampler, LogUniform,
                                         RandomSearch, SuccessiveHalving, SyncBOHB, Uniform, parse_space)

SPACE = {"lr": LogUniform(1e-4, 1e-1), "momentum": Uniform(0.5, 0.99), "layers": Choice((2, 3, 4))}


def loss(config, iterations):
    """Lower for lr near 1e-2; improves with training."""
    return abs(np.log10(config["lr"]) + 2) + 1.0 / (1 + iterations)


def drive(algorithm, slots=4, max_groups=500):
    """A fake controller: completes every trial of each handed-out group; returns the groups."""
    groups, running = [], []
    for _ in range(max_groups):
        while (g := algorithm.suggest(slots - len(running))) is not None:
            groups.append(g)
            running += list(g.trials)
        if not running:
            break
        t = running.pop(0)
        algorithm.on_trial_complete(t.trial_id, loss(t.config, t.resume_from + t.budget))
    assert algorithm.finished
    return groups


ALGOS = {
    "grid": lambda: GridSearch({"lr": Grid((1e-3, 1e-2)), "layers": Grid((2, 3, 4))}, budget=9),
    "random": lambda: RandomSearch(SPACE, budget=9, num_samples=6, seed=1),
    "sh": lambda: SuccessiveHalving(SPACE, num_samples=9, max_budget=9, eta=3, seed=1),
    "hyperband": lambda: Hyperband(SPACE, max_budget=9, eta=3, seed=1),
    "asha": lambda: ASHA(SPACE, num_samples=12, max_budget=9, eta=3, seed=1),
    "syncbohb": lambda: SyncBOHB(SPACE, max_budget=9, eta=3, seed=1),
    "bohb": lambda: BOHB(SPACE, num_samples=12, max_budget=9, eta=3, seed=1),
    "pbt": lambda: PBT(SPACE, population=4, interval=3, generations=3, seed=1),
}


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_algorithm_hands_out_valid_trial_groups_and_terminates_within_budget(name):
    algorithm = ALGOS[name]()
    groups = drive(algorithm)
    trials = [t for g in groups for t in g.trials]
    assert groups and all(g.trials for g in groups)
    assert len({t.trial_id for t in trials}) == len(trials)
    assert all(t.budget > 0 and t.resume_from + t.budget <= 9 + 1e-9 for t in trials)
    assert algorithm.best().score == min(r.score for r in algorithm.results if r.iterations == 9)


def test_grid_search_is_one_group_over_the_cross_product():
    groups = drive(ALGOS["grid"]())
    assert len(groups) == 1 and len(groups[0].trials) == 6


def test_successive_halving_keeps_the_best_third_per_rung():
    groups = drive(ALGOS["sh"]())
    assert [len(g.trials) for g in groups] == [9, 3, 1]
    rung0 = groups[0].trials
    best = min(rung0, key=lambda t: loss(t.config, 1))
    assert groups[2].trials[0].config == best.config
    final = groups[2].trials[0]
    assert final.resume_from == 3 and final.checkpoint in {t.trial_id for t in groups[1].trials}


def test_hyperband_runs_brackets_from_most_to_least_aggressive():
    groups = drive(ALGOS["hyperband"]())
    assert [len(g.trials) for g in groups] == [9, 3, 1, 5, 1, 3]  # s=2: 9,3,1; s=1: 5,1; s=0: 3


def test_asha_promotes_the_best_config_and_hands_out_at_most_slots():
    """Promotions are asynchronous (top third of the results seen so far), so they may exceed the final third."""
    algorithm = ALGOS["asha"]()
    groups = drive(algorithm, slots=4)
    assert max(len(g.trials) for g in groups) <= 4
    rung0 = {r.trial_id.split("@")[0]: r.score for r in algorithm.results if r.trial_id.endswith("@0")}
    promoted = {r.trial_id.split("@")[0] for r in algorithm.results if r.trial_id.endswith("@1")}
    assert len(rung0) == 12 and 0 < len(promoted) < len(rung0)
    assert min(rung0, key=rung0.get) in promoted


def test_kde_sampler_concentrates_on_good_configs_once_it_has_data():
    rng = np.random.default_rng(0)
    sampler = KDESampler(SPACE, rng, random_fraction=0.0)
    for cfg in RandomSearch(SPACE, budget=1, num_samples=40, seed=3).suggest(1).trials:
        sampler.observe(dict(cfg.config), 9, loss(cfg.config, 9))
    model = [abs(np.log10(c["lr"]) + 2) for c in sampler.sample(20)]
    uniform = [abs(np.log10(t.config["lr"]) + 2) for t in RandomSearch(SPACE, 1, num_samples=20, seed=4).suggest(1).trials]
    assert np.mean(model) < np.mean(uniform)


def test_pbt_replaces_the_worst_member_with_a_perturbed_copy_of_the_best():
    algorithm = PBT(SPACE, population=4, interval=3, generations=2, seed=2)
    gen0 = algorithm.suggest(4)
    for t in gen0.trials:
        algorithm.on_trial_complete(t.trial_id, loss(t.config, 3))
    gen1 = algorithm.suggest(4)
    scores = {t.trial_id: loss(t.config, 3) for t in gen0.trials}
    best, worst = min(scores, key=scores.get), max(scores, key=scores.get)
    replaced = gen1.trials[int(worst[1:4])]
    assert replaced.checkpoint == best and replaced.resume_from == 3
    parent_lr = gen0.trials[int(best[1:4])].config["lr"]
    assert replaced.config["lr"] in (pytest.approx(parent_lr * 0.8), pytest.approx(min(0.1, parent_lr * 1.2)))


def test_same_seed_same_configs():
    a = [t.config for t in RandomSearch(SPACE, 9, num_samples=5, seed=7).suggest(1).trials]
    b = [t.config for t in RandomSearch(SPACE, 9, num_samples=5, seed=7).suggest(1).trials]
    assert a == b


@pytest.mark.parametrize("make, field", [
    (lambda: GridSearch({}, budget=1), "space"),
    (lambda: RandomSearch(SPACE, budget=0), "budget"),
    (lambda: Hyperband(SPACE, max_budget=-1), "max_budget"),
    (lambda: ASHA(SPACE, num_samples=4, max_budget=9, min_budget=10), "min_budget"),
    (lambda: SuccessiveHalving(SPACE, num_samples=4, max_budget=9, eta=1), "eta"),
    (lambda: PBT(SPACE, population=1, interval=1, generations=1), "population"),
    (lambda: parse_space({"lr": {"uniform": [1, 0]}}), "space.lr"),
    (lambda: parse_space({"lr": {"normal": [0, 1]}}), "space.lr"),
])
def test_bad_tuning_input_raises_config_error_naming_the_field(make, field):
    with pytest.raises(ConfigError) as err:
        make()
    assert err.value.field == field


def test_gpu_imports_without_ray_torch_or_prefect():
    code = ("import sys, gpu.schedulers.fluid.tuning, gpu.schedulers.fluid.session, gpu.sim.fluid.run; "
            "print([m for m in ('ray', 'torch', 'prefect', 'mlflow') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
