"""ORLOJ in the serving runtime: application ids from the frontend to the policy, per-application SLOs, the
``observe`` feedback hook, and one stateful policy per worker."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu.systems import make_batch_policy as make_policy
from gpu.devices import discover
from gpu.errors import ConfigError
from gpu.ledger import PoolLedger
from gpu.schedulers.nexus.squishy import GpuNode, SessionPlacement, Plan, Session
from gpu.schedulers.nexus.profiles import linear_profile
from gpu.schedulers.orloj.policy import Histogram
from tasks.serving.frontend import Frontend
from tasks.serving.models import ARCHITECTURES, INPUT_FEATURES
from tasks.serving.runtime import LocalServingRuntime
from tasks.serving.stats import Recorder
from tasks.serving.worker import ServingWorker

SLO_MS = 1000.0


class _Inputs:
    """Digits-shaped rows (what the model's weights are does not matter here: what is served, dropped or
    observed does)."""

    x_test = torch.randn(16, INPUT_FEATURES, generator=torch.Generator().manual_seed(0)).numpy()


@pytest.fixture(scope="module")
def digits():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return _Inputs, {"digits_mlp": ARCHITECTURES["digits_mlp"]()}


def plan() -> Plan:
    node = GpuNode(0, 10.0, (SessionPlacement("s", "digits_mlp", SLO_MS, 4, 10.0, 1.0, 11.0),))
    return Plan("test", "paper", (node,), (Session("s", "digits_mlp", SLO_MS, 10.0),))


PROFILES = {"digits_mlp": linear_profile("digits_mlp", 0.01, 0.1, 16)}


def drive(worker: ServingWorker) -> None:
    with torch.inference_mode():
        while worker.run_once()[0]:
            pass


def test_the_policy_sees_each_requests_application(digits):
    """ORLOJ drops the application whose histogram says it can never meet the SLO and serves the other."""
    data, models = digits
    hists = {"fast": Histogram([0.5, 2.0], [1]), "slow": Histogram([5000.0, 6000.0], [1])}
    policy = make_policy("orloj", histograms=hists, mix="request_aware")
    rec = Recorder()
    front = Frontend(rec, apps={"fast": None, "slow": None})
    worker = ServingWorker(plan().nodes[0], models, PROFILES, policy, rec, apps=front.apps)
    front.set_plan(plan(), {0: worker})
    fast = front.submit_many("s", data.x_test[:6], app="fast")
    slow = front.submit_many("s", data.x_test[6:10], app="slow")
    drive(worker)
    served = {o.request_id for o in rec.outcomes if o.batch}
    dropped = {o.request_id for o in rec.outcomes if not o.batch}
    assert served == set(fast) and dropped == set(slow)


def test_an_application_with_its_own_slo_gets_its_own_deadline(digits):
    data, models = digits
    rec = Recorder()
    front = Frontend(rec, apps={"chat": 250.0, "batch": None})
    worker = ServingWorker(plan().nodes[0], models, PROFILES, make_policy("clockwork"), rec, apps=front.apps)
    front.set_plan(plan(), {0: worker})
    chat = front.submit("s", data.x_test[0], app="chat")
    other = front.submit("s", data.x_test[1], app="batch")
    drive(worker)
    budget = {o.request_id: o.deadline_ms - o.arrival_ms for o in rec.outcomes}
    assert budget[chat] == pytest.approx(250.0) and budget[other] == pytest.approx(SLO_MS)
    with pytest.raises(ConfigError) as err:
        front.submit("s", data.x_test[2], app="mail")
    assert err.value.field == "app"
    with pytest.raises(ConfigError) as err:
        Frontend(rec, apps={"chat": -5})
    assert err.value.field == "apps.chat.slo_ms"


def test_the_worker_reports_every_batch_to_a_policy_that_observes(digits):
    """Clipper-like AIMD grows its batch by one per batch within the SLO: the worker called ``observe``."""
    data, models = digits
    policy = make_policy("clipper")
    rec = Recorder()
    worker = ServingWorker(plan().nodes[0], models, PROFILES, policy, rec)
    front = Frontend(rec)
    front.set_plan(plan(), {0: worker})
    front.submit_many("s", data.x_test[:10])
    drive(worker)
    assert [o.batch for o in rec.outcomes] == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4]
    assert worker.batches == 4 and policy.size == 5 and len(rec.outcomes) == 10


def test_each_worker_gets_its_own_policy_and_span_policies_refuse_per_app_slos(digits):
    _, models = digits
    pool = PoolLedger(discover("2x16GiB", "simulated"))
    nodes = tuple(GpuNode(i, 10.0, (SessionPlacement("s", "digits_mlp", SLO_MS, 4, 5.0, 1.0, 11.0),)) for i in (0, 1))
    two = Plan("test", "paper", nodes, (Session("s", "digits_mlp", SLO_MS, 10.0),))
    with LocalServingRuntime(models, PROFILES, pool, policy_factory=lambda: make_policy("clipper"),
                             apps={"a": None}) as rt:
        rt.apply(two)
        policies = [w.policy for w in rt.workers.values()]
        assert len(policies) == 2 and policies[0] is not policies[1]
        assert all(w.apps == ("a",) for w in rt.workers.values())
    with pytest.raises(ConfigError) as err:
        LocalServingRuntime(models, PROFILES, pool, make_policy("early_drop"), apps={"a": 50.0})
    assert err.value.field == "apps"


@pytest.fixture(scope="module")
def dynamic():
    from tasks.serving.models import load_digits_tensors, load_or_train
    from tasks.ekya.streams import transform

    torch.set_num_threads(1)
    data = load_digits_tensors()
    clean = data.x_test[:60].numpy()
    noisy = transform(clean.reshape(-1, 8, 8), 0.0, 0.3, 1.0, np.random.default_rng(0))
    return load_or_train("digits_dynamic", steps=100), clean, noisy


@pytest.mark.slow
def test_corrupted_digits_exit_later_and_a_batch_waits_for_its_slowest_input(dynamic):
    model, clean, noisy = dynamic
    with torch.inference_mode():
        steps_clean = model.exit_steps(torch.from_numpy(clean)).float().mean()
        steps_noisy = model.exit_steps(torch.from_numpy(noisy)).float().mean()
        assert steps_noisy > steps_clean + 1
        batch = torch.from_numpy(np.concatenate([clean[:8], noisy[:8]]))
        alone = torch.cat([model(row) for row in batch.split(1)])
        assert torch.allclose(model(batch), alone, atol=1e-5)  # exits are per input, batch-mates only wait


@pytest.mark.slow
def test_the_worker_serves_digits_dynamic_with_orloj_and_accounts_for_every_request(dynamic):
    from gpu.schedulers.orloj.cost_model import PaddedBatchModel
    from tasks.serving.dynamic_models import alone_times

    model, clean, noisy = dynamic
    hists = alone_times(model, {"clean": clean[:30], "noisy": noisy[:30]})
    c0 = 0.5 * min(h.edges[0] for h in hists.values())
    p99 = max(h.quantile(0.99) for h in hists.values())
    slo = 200 * p99  # a loaded 2-core test machine: what is checked is the accounting, not the timing
    policy = make_policy("orloj", histograms=hists, model=PaddedBatchModel(c0))
    node = GpuNode(0, 10.0, (SessionPlacement("s", "digits_dynamic", slo, 8, 10.0, 1.0, 11.0),))
    one = Plan("test", "paper", (node,), (Session("s", "digits_dynamic", slo, 10.0),))
    profiles = {"digits_dynamic": linear_profile("digits_dynamic", 0.05, c0, 16)}
    rec = Recorder()
    front = Frontend(rec, apps={"clean": None, "noisy": None})
    worker = ServingWorker(node, {"digits_dynamic": model}, profiles, policy, rec, apps=front.apps)
    front.set_plan(one, {0: worker})
    ids = [*front.submit_many("s", clean[30:], app="clean"), *front.submit_many("s", noisy[30:], app="noisy")]
    drive(worker)
    outcomes = rec.outcomes
    assert sorted(o.request_id for o in outcomes) == ids
    assert sum(o.batch > 0 for o in outcomes) >= 50 and worker.batches < 60  # ORLOJ batches them


def test_the_serving_flow_accepts_every_registered_batch_policy():
    from flows.serving_rollout import prepare

    assert [prepare(None, None, p).batch_policy for p in ("orloj", "clipper")] == ["orloj", "clipper"]
    with pytest.raises(ConfigError) as err:
        prepare(None, None, "fifo")
    assert err.value.field == "batch_policy"


def test_a_session_shared_by_applications_is_parsed_and_loaded_by_their_shares():
    """The spec's ``apps``: shares that sum to 1, noisy inputs per application; the load generator sends each
    arrival as one of them, with that application's rows."""
    from tasks.serving.loadgen import LoadGenerator, RateTrace
    from tasks.serving.spec import parse_spec

    raw = {"sessions": [{"id": "s", "model": "digits_dynamic", "slo_ms": 50, "rate": 10,
                         "apps": [{"id": "clean", "share": 0.25}, {"id": "noisy", "share": 0.75, "noise": 0.3,
                                                                     "slo_ms": 80}]}]}
    spec = parse_spec(raw)
    assert spec.app_slos == {"clean": None, "noisy": 80.0}
    rows = np.random.default_rng(0).random((32, INPUT_FEATURES), dtype=np.float32)
    noisy = spec.apps[1].inputs(rows)
    assert spec.apps[0].inputs(rows) is rows and 0.1 < np.abs(noisy - rows).mean() < 0.3
    sent: dict[str, list] = {}

    def submit_many(sid, xs, t, app=None):
        sent.setdefault(app, []).append(xs)
        return range(len(xs))

    load = LoadGenerator(lambda sid, x, t, app=None: submit_many(sid, x, t, app)[0], RateTrace.constant({"s": 400.0}, 2.0),
                         torch.from_numpy(rows), submit_many=submit_many,
                         apps={"s": [(a.app_id, a.share, a.inputs(rows)) for a in spec.apps]})
    report = load.run()
    n = {a: sum(len(x) for x in v) for a, v in sent.items()}
    assert set(n) == {"clean", "noisy"} and 0.65 < n["noisy"] / report.sent < 0.85
    assert any(np.allclose(x[0], noisy[i]) for x in sent["noisy"] for i in range(32))
    for bad, field in (([{"id": "a", "share": 0.5}], "sessions[0].apps"), ([{"id": "s", "share": 1}], "sessions.apps")):
        with pytest.raises(ConfigError) as err:
            parse_spec({"sessions": [{**raw["sessions"][0], "apps": bad}]})
        assert err.value.field == field


@pytest.mark.usefixtures("prefect_server")
def test_the_serving_flow_serves_two_applications_of_a_dynamic_model_with_orloj(state_dir):
    """One ``digits_dynamic`` session that clean and noisy digits share (the thesis's workload): ORLOJ decides
    in the workers through its controller, and the epoch at 2 s re-profiles each application from its batches."""
    from flows.serving_rollout import serving_rollout
    from resource_blocks import GpuPool
    from tasks.runtime.runners import GpuTaskRunner

    spec = {"name": "dynamic", "runtime": {"training_steps": 30, "profile_repeats": 3, "batch_policy": "orloj"},
            "sessions": [{"id": "digits", "model": "digits_dynamic", "slo_ms": 200, "rate": 80,
                          "apps": [{"id": "clean", "share": 0.5}, {"id": "noisy", "share": 0.5, "noise": 0.3}]}],
            "trace": {"duration_s": 4, "seed": 1, "phases": [{"at_s": 0, "scale": 1.0}]},
            "epoch": {"epoch_s": 2, "min_epoch_s": 1, "beacon_s": 1, "avg_interval_s": 1}}
    run = GpuTaskRunner(pool=GpuPool(name="orloj", device_backend="simulated"), mode="thread", tracking=False)
    result = serving_rollout.with_options(task_runner=run)(spec)
    assert result["batch_policy"] == "orloj" and result["requests"] > 200
    assert result["slo_attainment"] > 0.5
    (epoch,) = result["orloj_epochs"]  # the epoch at 2 s re-profiled both applications from their served batches
    assert epoch["t_s"] == 2.0 and set(epoch["apps"]) == {"clean", "noisy"}
    assert all(a["reprofiled"] and a["batches"] >= 10 and a["batch_limit"] >= 1 for a in epoch["apps"].values())


def test_a_batch_cost_table_the_fit_refuses_is_measured_again_with_more_repeats(monkeypatch):
    """The serving rollout times its dynamic model before it serves (``depth_profile``). The fixed part of a batch
    is a fraction of one layer, so a loaded machine once made the fit's fixed part negative, which the fit refuses
    and which crashed the flow. The table is measured again with twice the repeats, and only a table refused every
    time fails, naming the network."""
    import tasks.serving.batch_costs as batch_costs

    sizes, depths = (1, 2, 4), (1, 6, 12)
    good = np.array([[0.12 + 0.1 * d * b ** 0.5 for d in depths] for b in sizes])
    noisy = good - 0.15  # the same slopes, the fixed part (0.12 ms) below zero
    tables, asked = [noisy, good], []

    def timed(network, device, batch_sizes, depths_, repeats, warmup):
        asked.append(repeats)
        return tables.pop(0) if tables else noisy

    monkeypatch.setattr(batch_costs, "time_network", timed)
    profile = batch_costs.depth_profile("digits_dynamic", batch_sizes=sizes, depths=depths, repeats=3)
    assert asked == [3, 6] and profile.fixed_ms[0] > 0 and np.array_equal(profile.ms, good)
    asked.clear()
    with pytest.raises(ConfigError) as err:
        batch_costs.depth_profile("digits_dynamic", batch_sizes=sizes, depths=depths, repeats=3)
    assert asked == [3, 6, 12] and err.value.field == "network"
