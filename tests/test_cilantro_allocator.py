"""The flow's saved Cilantro state: it round-trips through the round controller, states of earlier versions
resume, and a file that cannot be resumed is one error naming it."""

from __future__ import annotations

import json

import pytest

import flows.allocation_rounds as ar
from gpu.errors import ConfigError
from tasks.cilantro.allocator import RoundBook, load_state, open_book, save_state, state_path


def settings(name: str, resume: bool = True):
    return ar.settings_from(rounds=1, round_s=2.0, policy="cilantro-njc", capacity=1.0, unit=0.05, resume=resume,
                            run_name=name, jobs=None, report_s=0.5, max_change=0.2, trace_step=1, warmup_reports=0,
                            seed=0, pool_gpus=1)


def test_a_saved_book_resumes_with_its_planned_decision_and_its_learners(state_dir):
    s = settings("book")
    book = RoundBook(s)
    d0 = book.ctl.on_round(0.0, {})
    report = {"alloc": 0.35, "loads": [400.0] * 4, "perf": [1.0] * 4, "sigma": [0.025] * 4}
    from tasks.cilantro.allocator import report_of

    d1 = book.ctl.on_round(2.0, {name: report_of(report) for name in d0.allocation})
    save_state("book", book.to_state())
    again = open_book(s, load_state("book"))
    assert again.ctl.planned == d1 and again.ctl.next_round == 1
    assert again.ctl.learners["svc-a"].num_points == 4


def test_a_state_of_the_earlier_format_resumes(state_dir):
    s = settings("old")
    book = RoundBook(s)
    book.ctl.on_round(0.0, {})
    old = book.to_state()
    old.pop("planned")
    assert open_book(s, json.loads(json.dumps(old))).ctl.on_round(2.0, {}).round_index == 0


@pytest.mark.parametrize("text", ["{not json", json.dumps({"fingerprint": {}})])
def test_a_state_that_cannot_be_resumed_is_an_error_naming_the_file(state_dir, text):
    path = state_path("broken")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        open_book(settings("broken"), load_state("broken"))
    assert err.value.field == "state" and err.value.value == str(path)
    assert open_book(settings("broken", resume=False), None).ctl.next_round == 0  # resume=False starts over


def test_the_flow_refuses_oracle_policies_naming_the_policy():
    with pytest.raises(ConfigError, match="policy='oracle-njc': an oracle is given each job's true curve"):
        ar.settings_from(rounds=1, round_s=2.0, policy="oracle-njc", capacity=1.0, unit=0.05, resume=True,
                         run_name="x", jobs=None, report_s=0.5, max_change=0.2, trace_step=1, warmup_reports=0,
                         seed=0, pool_gpus=1)
