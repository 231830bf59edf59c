"""Salus (thesis Ch. 2): Algorithm 2.1's outcomes, Eq. 2.1, Fig. 2.6b's reclaim, the iteration policies."""

import math

import numpy as np
import pytest

from gpu.contract import contract_violations, is_frozen_decision
from gpu.errors import ConfigError, NeverFitsError
from gpu.schedulers.salus.controller import Ask, Run, SalusController, SalusJob
from gpu.schedulers.salus.lanes import NO_MARGINS, LaneManager, Margins
from gpu.schedulers.salus.overrun import TokenBound

C = 16_000.0  # a P100's 16 GB, in MB


def _manager(**kw):
    return LaneManager(C, NO_MARGINS, **kw)


# --- Algorithm 2.1 ------------------------------------------------------------------------------------------
def test_algorithm_2_1_opens_a_new_lane_while_memory_allows():
    m = _manager()
    assert m.admit("a", 1000, 3000).outcome == "new"
    assert m.admit("b", 1000, 4000).outcome == "new"
    assert [v.size_mb for v in m.lanes()] == [3000, 4000]


def test_algorithm_2_1_joins_the_smallest_lane_that_fits_ties_to_fewest_jobs():
    m = _manager()
    m.admit("a", 1000, 3000), m.admit("b", 1000, 5000), m.admit("c", 1000, 3000)  # 3000 + 8000 + 3000 = 14000
    choice = m.admit("d", 1000, 2500)  # no room for a new 2500 lane (17500 > 16000); lanes 0 and 2 are 3000
    assert (choice.outcome, choice.lane_id) == ("join", 0)
    assert m.admit("e", 500, 2000).lane_id == 2  # lane 0 has two jobs now, lane 2 one


def test_joining_still_needs_room_for_the_persistent_memory():
    """Lines 4-6 re-check sum P + P + sum L <= C (otherwise Eq. 2.1 breaks when a big-P job joins)."""
    m = _manager()
    m.admit("a", 1000, 14000)
    assert m.find(1500, 1000).outcome == "not_found"  # 1000 + 1500 + 14000 > 16000 though the lane is big enough
    assert m.find(1000, 1000).outcome == "join"


def test_algorithm_2_1_grows_the_smallest_growable_lane():
    m = _manager()
    m.admit("a", 500, 2000), m.admit("b", 500, 3000), m.admit("c", 500, 4000)  # used 10500
    choice = m.admit("d", 1000, 5000)  # new: 16500 > C; no lane >= 5000; grow lane 0: 11500 - 2000 + 5000 fits
    assert (choice.outcome, choice.lane_id, choice.size_mb) == ("grow", 0, 5000)
    assert [v.size_mb for v in m.lanes()] == [5000, 3000, 4000]


def test_algorithm_2_1_grows_a_larger_lane_when_growing_the_smallest_would_not_fit():
    m = _manager()
    m.admit("a", 1000, 2000), m.admit("b", 1000, 3000), m.admit("c", 1000, 6000)  # used 14000
    choice = m.admit("d", 500, 7000)  # grow 2000: 19500, grow 3000: 18500, grow 6000: 15500 <= 16000
    assert (choice.outcome, choice.lane_id) == ("grow", 2)


def test_not_found_changes_nothing():
    m = _manager()
    m.admit("a", 2000, 13000)
    before = m.lanes()
    assert m.admit("b", 2000, 13000).outcome == "not_found"
    assert m.lanes() == before and "b" not in m.persistent


def test_margins_charge_persistent_and_total_and_keep_a_reserve():
    m = LaneManager(C)  # P x 1.1, P+E x 1.05, 300 MB reserve
    assert m.charge("j", 1000, 4000) == pytest.approx((1155.0, 4200.0))
    assert m.usable_mb == C - 300
    with pytest.raises(NeverFitsError, match="job big.*16000 MB"):
        m.charge("big", 1000, 14000)


@pytest.mark.parametrize("p, e", [(0, 100), (100, -1), (math.nan, 100), (100, math.inf), (True, 100)])
def test_bad_sizes_raise_one_config_error_naming_the_job(p, e):
    with pytest.raises(ConfigError, match=r"jobs\[j\]\.(persistent|ephemeral)_mb"):
        LaneManager(C).charge("j", p, e)


# --- Eq. 2.1 under random arrivals and departures -----------------------------------------------------------
def test_eq_2_1_holds_and_jobs_queue_only_when_not_found_under_random_churn():
    rng = np.random.default_rng(7)
    for policy in ("pack", "fair", "srtf", "fifo"):
        ctl = SalusController(C, policy)
        live, arrivals = [], 0
        for step in range(600):
            if rng.random() < 0.55 or not live:
                job = SalusJob(f"j{arrivals}", float(rng.uniform(100, 900)), float(rng.uniform(200, 9000)),
                               expected_s=float(rng.uniform(10, 100)))
                arrivals += 1
                would = ctl.lanes.find(*ctl.lanes.charge(job.job_id, job.persistent_mb, job.ephemeral_mb))
                queue_before = bool(ctl.queue)
                out = ctl.on_arrival(float(step), job)
                if out.queued:  # queued only when Algorithm 2.1 said "not found"
                    assert would.outcome == "not_found" or queue_before
                else:
                    assert would.outcome != "not_found"
                live.append(job.job_id)
            else:
                busy = list(ctl.running.values())
                if busy and rng.random() < 0.6:
                    ctl.on_iteration(float(step), busy[int(rng.integers(len(busy)))], 0.1)
                else:
                    ctl.on_job_done(float(step), live.pop(int(rng.integers(len(live)))), 0.1)
            ctl.lanes.check()
            assert ctl.lanes.used_mb() <= ctl.lanes.usable_mb + 1e-6


# --- auto-defragmentation (Fig. 2.6b) -----------------------------------------------------------------------
def test_departed_lane_is_reclaimed_by_the_lane_below_at_its_iteration_boundary():
    """Fig. 2.6b: job C stops; job B, in the lane below, slides up at its next boundary; D then gets room."""
    ctl = SalusController(C, "pack", margins=NO_MARGINS)
    for name, p, e in (("A", 1000, 3000), ("C", 1000, 4000), ("B", 1000, 5000)):
        ctl.on_arrival(0.0, SalusJob(name, p, e))
    lanes = {v.jobs[0]: v for v in ctl.lane_views()}
    assert (lanes["C"].offset_mb, lanes["B"].offset_mb) == (9000, 4000)  # stacked down from the top
    assert set(ctl.running.values()) == {"A", "B", "C"}
    ctl.on_job_done(1.0, "C")
    step = ctl.on_arrival(1.0, SalusJob("D", 500, 4500))  # Eq. 2.1: 2500 + 8000 + 4500 <= 16000 -> new lane
    assert [a.outcome for a in step.admitted] == ["new"]
    assert not any(r.job_id == "D" for r in step.runs)  # D's span is still B's (B is mid-iteration)
    b = next(v for v in ctl.lane_views() if v.jobs == ("B",))
    assert b.placed_offset_mb == 4000 and b.offset_mb == 8000
    step = ctl.on_iteration(2.0, "B", 1.0)  # B's boundary: its lane moves up into C's space, D's lane opens
    assert {(m.lane_id, m.offset_mb) for m in step.moves} == {(b.lane_id, 8000), (b.lane_id + 1, 3500)}
    assert {r.job_id for r in step.runs} == {"B", "D"}


def test_lanes_in_place_keep_running_while_another_lane_waits_to_slide():
    """Lanes e, a, b, c stacked from the top; a's job leaves while b is mid-iteration, so b cannot slide up yet
    and c (whose new span is still b's) waits below it, at an offset a large job's persistent memory then
    passes. Only b and c wait for b's boundary: e, at its place and clear of the persistent region, runs on,
    and the newcomer's lane opens once c has moved."""
    lanes = LaneManager(10_000, NO_MARGINS)
    placed = {}
    for job, e in (("e", 1000), ("a", 500), ("b", 1000), ("c", 1000)):
        placed[job] = lanes.admit(job, 100, e).lane_id
    lanes.settle(set(placed.values()))
    assert all(lanes.ready(lid) for lid in placed.values())
    lanes.release("a")  # between two of b's iterations: b's lane is busy
    lanes.settle({placed["e"], placed["c"]})
    view = {v.jobs[0]: v for v in lanes.lanes()}
    assert view["c"].placed_offset_mb == 6500 and view["c"].offset_mb == 7000  # its new span overlaps b's
    d = lanes.admit("d", 6300, 300)  # Alg. 2.1: 300 + 6300 + 3000 + 300 <= 10000 -> a new lane at the bottom
    lanes.settle({placed["e"], placed["c"], d.lane_id})
    assert sum(lanes.persistent.values()) > view["c"].placed_offset_mb  # c's old span reaches into P's region
    assert lanes.ready(placed["e"])  # in place: runs on while b finishes its iteration
    assert not lanes.ready(placed["c"]) and not lanes.ready(d.lane_id)
    lanes.settle(set(lanes.lane_of.values()))  # b's boundary: b slides up, then c, then d's lane opens
    assert all(lanes.ready(lid) for lid in lanes.lane_of.values())


def test_a_grown_lane_waits_for_its_iteration_boundary():
    ctl = SalusController(C, "pack", margins=NO_MARGINS)
    for name, p, e in (("a", 500, 2000), ("b", 500, 3000), ("c", 500, 4000)):
        ctl.on_arrival(0.0, SalusJob(name, p, e))
    step = ctl.on_arrival(0.0, SalusJob("d", 1000, 5000))
    assert [(a.outcome, a.lane_id) for a in step.admitted] == [("grow", 0)]
    assert step.runs == ()  # lane 0 is running a's iteration at its old size, lanes below must move down too
    step = ctl.on_iteration(1.0, "a", 1.0)
    assert not step.runs  # lane 0 cannot grow until lanes 1 and 2 move down at their boundaries
    ctl.on_iteration(1.0, "c", 1.0), ctl.on_iteration(1.0, "b", 1.0)
    lanes = ctl.lane_views()
    assert all(v.settled for v in lanes) and lanes[0].size_mb == 5000
    assert set(ctl.running.values()) >= {"b", "c"} and ctl.running[0] in {"a", "d"}


# --- a token holder past its bound (gpu.schedulers.salus.overrun) ----------------------------------------------
def _one_lane(capacity_mb: float) -> SalusController:
    """FAIR's one lane holding a and b (P 100, E 1000 MB); a runs an iteration of 1 s, then its second one."""
    ctl = SalusController(capacity_mb, "fair", margins=NO_MARGINS, token_bound=TokenBound(floor_s=5.0, factor=10.0))
    for job in ("a", "b"):
        ctl.on_arrival(0.0, SalusJob(job, 100, 1000, on_demand=True))
    assert ctl.on_arrival(0.0, Ask("a")).runs == (Run(0, "a"),)
    ctl.on_iteration(1.0, "a", 1.0, more=True)  # b has not asked yet: a goes on
    ctl.on_arrival(1.0, Ask("b"))  # b waits for a's boundary
    assert ctl.running == {0: "a"}
    return ctl


def test_a_token_holder_past_its_bound_loses_the_token_and_its_lanemate_goes_on_beside_its_fence():
    ctl = _one_lane(10_000)
    assert ctl.token_deadline() == 11.0  # bound = max(5 s floor, 10 x its 1 s iteration)
    assert ctl.on_wake(10.5) == ctl.on_wake(10.5).__class__()  # within its bound: nothing happens
    step = ctl.on_wake(11.5)
    assert [(r.job_id, r.lane_id, r.held_s, r.bound_s) for r in step.revoked] == [("a", 0, 10.5, 10.0)]
    assert step.runs == (Run(1, "b"),)  # b goes on in a lane of its own ...
    assert ctl.lanes.fenced == {0: "a"} and ctl.lanes.used_mb() == 200 + 1000 + 1000  # ... a's memory kept
    assert ctl.on_wake(13.0).revoked == ()  # reported once (and b, granted at 11.5, is within its bound)
    ctl.on_arrival(13.0, SalusJob("c", 100, 500, on_demand=True))
    assert ctl.lanes.lane_of["c"] == 1  # a newcomer never joins the fence
    step = ctl.on_iteration(100.0, "a", 99.0, more=True)  # a resumed: its iteration ends, its memory is back
    assert not ctl.lanes.fenced and ctl.lanes.lane_of["a"] == 1 and len(ctl.lane_views()) == 1
    assert ctl.running == {1: "b"} and ctl.consumed_s("a") == 1.0 + 10.5  # charged until it lost the token
    assert ctl.on_iteration(101.0, "b", 1.0).runs == (Run(1, "a"),)  # it waited for the token again
    assert ctl.token_holders(101.0)[0].bound_s == 10.0  # the stop is no measured iteration


def test_a_lanemate_waits_for_room_beside_the_fence_and_goes_on_when_the_stopped_job_leaves():
    ctl = _one_lane(2_000)  # 200 + 1000 used: no room for a second lane of 1000 MB
    step = ctl.on_wake(12.0)
    assert [r.job_id for r in step.revoked] == ["a"] and step.runs == ()
    assert ctl.lanes.fenced == {0: "a"} and ctl.lanes.lane_of["b"] == 0
    step = ctl.on_job_done(30.0, "a")  # its worker was killed: the lane is b's
    assert step.runs == (Run(0, "b"),) and not ctl.lanes.fenced


# --- policies ------------------------------------------------------------------------------------------------
def _drive(ctl, jobs, iter_s=1.0):
    """Run jobs of ``(arrival, job, iterations)`` on one lane per run decision; log (time, job) per iteration."""
    arrivals = sorted(jobs, key=lambda x: x[0])
    left = {job.job_id: n for _, job, n in jobs}
    log, t, running = [], 0.0, {}
    pending = list(arrivals)
    while pending or running:
        if not running:
            t = max(t, pending[0][0])
        end = t + iter_s if running else t
        while pending and pending[0][0] <= end:  # arrivals during the iteration in flight come before its end
            arrival, job, _ = pending.pop(0)
            for r in ctl.on_arrival(arrival, job).runs:
                running[r.lane_id] = r.job_id
        if end == t:
            continue
        t = end
        for lane, job_id in list(running.items()):
            del running[lane]
            log.append((t, job_id))
            left[job_id] -= 1
            step = ctl.on_iteration(t, job_id, iter_s) if left[job_id] else ctl.on_job_done(t, job_id, iter_s)
            for r in step.runs:
                running[r.lane_id] = r.job_id
    return log


def test_srtf_preempts_the_long_job_only_at_its_iteration_boundary():
    """Fig. 2.8a: the background job #0 runs only when no shorter job exists."""
    ctl = SalusController(C, "srtf", margins=NO_MARGINS)
    log = _drive(ctl, [(0.0, SalusJob("long", 500, 2000, expected_s=100), 6),
                       (2.5, SalusJob("short", 500, 2000, expected_s=2), 2)])
    assert [j for _, j in log] == ["long", "long", "long", "short", "short", "long", "long", "long"]
    assert log[2] == (3.0, "long")  # the iteration in flight at 2.5 s finished before the switch


def test_srtf_runs_the_shorter_of_two_waiting_jobs_first():
    """Fig. 2.8a: job #2 arrives before #3, but #3 is shorter and runs first."""
    ctl = SalusController(C, "srtf", margins=NO_MARGINS)
    log = _drive(ctl, [(0.0, SalusJob("j0", 500, 2000, expected_s=50), 3),
                       (0.5, SalusJob("j2", 500, 2000, expected_s=5), 5),
                       (0.6, SalusJob("j3", 500, 2000, expected_s=2), 2)])
    order = [j for _, j in log]
    assert order[:4] == ["j0", "j3", "j3", "j2"]


def _srtf_order(ctl, jobs, seconds):
    """Run ``(job, iterations)`` (all arrived at 0) in SRTF's one lane, each iteration taking ``seconds[job]``;
    the order of iterations run."""
    left = {job.job_id: n for job, n in jobs}
    runs = [r.job_id for job, _ in jobs for r in ctl.on_arrival(0.0, job).runs]
    order, t = [], 0.0
    while runs:
        job_id = runs[0]
        t += seconds[job_id]
        order.append(job_id)
        left[job_id] -= 1
        step = ctl.on_iteration(t, job_id, seconds[job_id]) if left[job_id] else ctl.on_job_done(t, job_id)
        runs = [r.job_id for r in step.runs]
    return order


def test_srtf_ranks_by_measured_iteration_time_and_the_declaration_is_only_a_prior():
    """Two jobs declare the same 10 s over 10 iterations; "heavy" arrives first and measures 10 s per iteration.
    Ranked by declared − used (the authors' code) it reaches 0 s left after its first iteration and runs to the
    end while "light" waits; ranked by what it measured once past its warm-up iteration (the prior 1 s moved 30 %
    towards 10 s: 3.7 s x 8 left = 29.6 s) it yields to "light" (1 s x 9 left)."""
    ctl = SalusController(C, "srtf", margins=NO_MARGINS)
    jobs = [(SalusJob("heavy", 500, 2000, expected_s=10, iterations=10), 10),
            (SalusJob("light", 500, 2000, expected_s=10, iterations=10), 10)]
    order = _srtf_order(ctl, jobs, {"heavy": 10.0, "light": 1.0})
    assert order == ["heavy"] * 2 + ["light"] * 10 + ["heavy"] * 8


def test_srtf_follows_a_job_whose_iterations_slow_down_as_it_runs():
    """The estimate is re-measured at every boundary (a moving average), not fixed after the first iterations; the
    first, warm-up iteration (lazy state) is not averaged."""
    ctl = SalusController(C, "srtf", margins=NO_MARGINS)
    ctl.on_arrival(0.0, SalusJob("a", 500, 2000, expected_s=40, iterations=40))
    ctl.on_iteration(1.0, "a", 6.0)  # building its state: the prior still ranks it (1 s x 39 left)
    assert ctl.iteration_s("a") == 1.0 and ctl.remaining_s("a") == pytest.approx(39.0)
    for t in range(2, 6):
        ctl.on_iteration(float(t), "a", 1.0)
    assert ctl.iteration_s("a") == pytest.approx(1.0) and ctl.remaining_s("a") == pytest.approx(35.0)
    for t in range(6, 16):
        ctl.on_iteration(float(t), "a", 4.0)  # its iterations became 4x heavier
    assert 3.8 < ctl.iteration_s("a") < 4.0 and ctl.remaining_s("a") == pytest.approx(25 * ctl.iteration_s("a"))


def test_a_real_job_says_how_many_iterations_it_runs_when_it_first_asks():
    """The executor's jobs are on-demand: ``Ask(iterations=n)`` from ``salus_iterations(n)`` gives SRTF the
    iterations left and the prior per iteration (declared / n); several iterations reported at once (a simulator's
    step) count as that many."""
    ctl = SalusController(C, "srtf", margins=NO_MARGINS)
    ctl.on_arrival(0.0, SalusJob("a", 500, 2000, expected_s=100, on_demand=True))
    assert ctl.remaining_s("a") == 100 and ctl.iteration_s("a") is None  # iterations unknown: declared - used
    ctl.on_arrival(0.0, Ask("a", iterations=20))
    assert ctl.iteration_s("a") == 5.0
    ctl.on_iteration(0.5, "a", 0.2, more=True)  # warm-up
    ctl.on_iteration(0.5, "a", 1.5, more=True, iterations=3)  # 0.5 s each
    assert ctl.iteration_s("a") == pytest.approx(0.3 * 0.5 + 0.7 * 5.0)
    assert ctl.remaining_s("a") == pytest.approx(16 * ctl.iteration_s("a"))
    with pytest.raises(ConfigError, match=r"jobs\[a\]\.iterations"):
        Ask("a", iterations=0)
    with pytest.raises(ConfigError, match=r"jobs\[b\]\.iterations"):
        SalusJob("b", 500, 2000, iterations=2.5)


def test_fair_alternates_iterations_and_halves_shares():
    ctl = SalusController(C, "fair", margins=NO_MARGINS)
    log = _drive(ctl, [(0.0, SalusJob("a", 500, 2000), 10), (4.0, SalusJob("b", 500, 2000), 4)])
    after = [j for t, j in log if 4.0 < t <= 12.0]
    assert after.count("a") == after.count("b") == 4


def test_weighted_fair_gives_lane_time_in_proportion_to_weights():
    ctl = SalusController(C, "weighted_fair", margins=NO_MARGINS)
    log = _drive(ctl, [(0.0, SalusJob("train", 500, 2000, weight=3.0), 30),
                       (0.0, SalusJob("infer", 500, 2000, weight=1.0), 30)])
    first = [j for _, j in log[:20]]
    assert first.count("train") == 15 and first.count("infer") == 5


def test_fifo_runs_one_job_at_a_time_in_arrival_order():
    ctl = SalusController(C, "fifo", margins=NO_MARGINS)
    log = _drive(ctl, [(0.0, SalusJob("a", 500, 2000), 2), (0.1, SalusJob("b", 500, 2000), 2)])
    assert [j for _, j in log] == ["a", "a", "b", "b"]
    assert ctl.queue == ()


def test_pack_runs_lanes_in_parallel():
    ctl = SalusController(C, "pack", margins=NO_MARGINS)
    step = ctl.on_arrival(0.0, SalusJob("a", 500, 2000))
    step2 = ctl.on_arrival(0.0, SalusJob("b", 500, 2000))
    assert step.runs == (Run(0, "a"),) and step2.runs == (Run(1, "b"),)


def test_a_killed_job_frees_its_lane_and_the_queue_moves_on():
    ctl = SalusController(C, "pack", margins=NO_MARGINS)
    ctl.on_arrival(0.0, SalusJob("big", 1000, 14000))
    assert ctl.on_arrival(0.0, SalusJob("next", 2000, 13000)).queued == ("next",)
    step = ctl.on_job_done(0.5, "big")  # killed mid-iteration
    assert [a.job_id for a in step.admitted] == ["next"] and step.runs[0].job_id == "next"


def test_an_inference_job_runs_an_iteration_only_for_a_query():
    ctl = SalusController(C, "pack", margins=NO_MARGINS, admission="one_lane")
    assert ctl.on_arrival(0.0, SalusJob("m1", 200, 300, on_demand=True)).runs == ()
    assert ctl.on_arrival(0.0, SalusJob("m2", 200, 500, on_demand=True)).runs == ()
    assert ctl.on_arrival(0.1, Ask("m2")).runs == (Run(0, "m2"),)
    ctl.on_arrival(0.1, Ask("m1")), ctl.on_arrival(0.1, Ask("m1"))  # lane busy: both wait
    assert ctl.on_iteration(0.2, "m2", 0.1).runs == (Run(0, "m1"),)
    assert ctl.on_iteration(0.3, "m1", 0.1).runs == (Run(0, "m1"),)
    assert ctl.on_iteration(0.4, "m1", 0.1).runs == ()


# --- contract and bad input ---------------------------------------------------------------------------------
def test_controller_follows_the_contract_and_returns_frozen_decisions():
    ctl = SalusController(C, "fair")
    assert contract_violations(ctl) == []
    assert is_frozen_decision(ctl.on_arrival(0.0, SalusJob("a", 100, 200)))


def test_bad_input_fails_before_any_work():
    with pytest.raises(ConfigError, match="policy"):
        SalusController(C, "lottery")
    with pytest.raises(ConfigError, match=r"jobs\[a\]\.expected_s"):
        SalusController(C, "srtf").on_arrival(0.0, SalusJob("a", 100, 200))
    ctl = SalusController(C, "pack")
    with pytest.raises(NeverFitsError, match="job huge"):
        ctl.on_arrival(0.0, SalusJob("huge", 8000, 8000))
    assert ctl.queue == () and ctl.lane_views() == ()
    with pytest.raises(ConfigError, match="capacity_mb"):
        SalusController(-1, "pack")
    with pytest.raises(ConfigError, match="margins.total"):
        Margins(total=0.5)
    with pytest.raises(ConfigError, match=r"jobs\[w\]\.weight"):
        SalusJob("w", 1, 1, weight=0)
    with pytest.raises(ConfigError, match=r"^jobs\[t\]\.token_floor_s=1e\+30"):
        SalusJob("t", 1, 1, token_floor_s=1e30)
    for bad in (dict(floor_s=0), dict(floor_s=float("nan")), dict(factor=0.5), dict(factor=1e30)):
        with pytest.raises(ConfigError, match=r"^token_bound\."):
            TokenBound(**bad)


def test_a_profiled_job_is_readmitted_with_its_measured_sizes_before_a_shorter_queued_job():
    """``Profiled``: its persistent memory is resident already, so it goes first even where SRTF would pick the
    queued job; it must not hold its lane's token."""
    from gpu.schedulers.salus.controller import Profiled

    ctl = SalusController(C, "srtf", NO_MARGINS)
    ctl.on_arrival(0.0, SalusJob("p", 1.0, C - 1.0, expected_s=100.0, on_demand=True))  # profiled: whole device
    assert ctl.on_arrival(0.0, SalusJob("s", 2500, 3000, expected_s=1.0, on_demand=True)).queued == ("s",)
    assert [r.job_id for r in ctl.on_arrival(0.1, Ask("p")).runs] == ["p"]
    with pytest.raises(ConfigError, match="holds its lane's token"):
        ctl.on_arrival(0.2, Profiled("p", 8000, 6000))
    ctl.on_iteration(0.2, "p", 0.1)
    step = ctl.on_arrival(0.2, Profiled("p", 8000, 6000))  # 14000 MB: no room for "s" (2500 + 3000) beside it
    assert [a.job_id for a in step.admitted] == ["p"]
    assert ctl.queue == ("s",)
