"""What every gpuflows flow does the same way, whichever entry point started it.

A flow is ONE Prefect flow whose decorator carries ``GpuTaskRunner(configure=<module-level function>)``: the
runner takes its pool, mode and MLflow target from the flow run's own parameters (a block, a saved block's
name or the defaults) on first use. ``python -m flows.<name>``, ``gpuflows demo``, a test calling the flow and
``prefect deployment run`` therefore run the same flow with the same runner; the run the user clicks holds the
task runs, the artifacts and the link to its MLflow run (artifact ``mlflow-run``), and that MLflow run links
back (tags ``prefect.flow_run_id``, ``prefect.flow_run_url``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from resource_blocks import GpuPool, MlflowTarget
from resource_blocks.mlflow_target import default_tracking_uri
from tasks.runtime.runners import MODES, PlacingTaskRunner, flow_mlflow_run_id
from tasks.runtime.tracking import VIEW_ID, ExperimentView, flow_run_name, flow_tracker


@dataclass(frozen=True)
class RunIdentity:
    """What a flow run is, from its parameters alone: the system it runs and what it chose (policy, placement,
    executor...). It names the MLflow experiment (``gpuflows-<system>``) and the run, in Prefect and MLflow alike
    (``<system>-<policy>-<placement>-<time>``), whichever entry point started the run: the command line, a
    deployment, a script. Each flow's ``identity(parameters)`` builds it and must accept any parameters (bad ones
    are the flow's own checks to report)."""

    system: str
    parts: tuple[str | None, ...] = ()

    @property
    def experiment(self) -> str:
        return f"gpuflows-{self.system}"

    def run_name(self, when: float | None = None) -> str:
        return flow_run_name(self.system, *self.parts, when=when)


def run_namer(identity: Callable[[dict[str, Any]], RunIdentity]) -> Callable[[], str]:
    """A flow's ``flow_run_name``: Prefect calls it as the run starts, so the run the Prefect UI lists is named
    like its MLflow run (``ekya-thief-2026-11-24T16:40:07``) instead of a random pair of words."""

    def name() -> str:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        run = ctx.flow_run if ctx else None
        when = run.expected_start_time.timestamp() if run is not None and run.expected_start_time else None
        return identity(dict(ctx.parameters or {}) if ctx else {}).run_name(when)

    return name


def pool_block(pool: GpuPool | str | dict | None, default: GpuPool | None = None) -> GpuPool:
    """A GpuPool parameter as a block: the block itself, a saved block's name, or ``default`` (else the saved
    default block or a simulated 2 x 16 GiB pool) when None. A flow's ``default`` is its own simulated pool, and
    on real GPUs the machine's one pool (``GpuPool.on_this_machine``)."""
    if isinstance(pool, GpuPool):
        return pool
    if isinstance(pool, dict):  # a block passed through the API as its fields
        return GpuPool(**pool)
    if not pool and default is not None:
        return default.on_this_machine()
    return GpuPool.load_or_default(pool)


def tracking_target(tracking: MlflowTarget | bool | str | dict | None, experiment: str | None = None) -> MlflowTarget:
    """A tracking parameter as an MlflowTarget: the block, a saved block's name, False (off) or None (default).

    A target that names no experiment gets ``experiment``, the flow's system's (``RunIdentity.experiment``): the
    command line checks its arguments outside the flow and hands the flow the target it built, so the experiment is
    filled in here, where both pass, and a run lands in its system's experiment whatever started it."""
    if isinstance(tracking, MlflowTarget):
        target = tracking
    elif isinstance(tracking, dict):
        target = MlflowTarget(**tracking)
    elif isinstance(tracking, str):
        target = MlflowTarget.load_or_default(tracking)
    else:
        target = MlflowTarget(enabled=tracking is not False)
    return target.model_copy(update={"experiment": experiment}) if experiment and not target.experiment else target


def flow_runner() -> PlacingTaskRunner | None:
    """The current flow run's GPU task runner with its settings resolved (None under another task runner)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = ctx.task_runner if ctx else None
    return runner.resolve() if isinstance(runner, PlacingTaskRunner) else None


def mlflow_run_url(tracking_uri: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """Where the MLflow UI shows the run (``tab``: e.g. "artifacts"): the tracking server itself, or ``mlflow ui``
    on its default port. MLflow 3's UI starts in its GenAI view (traces, no run table) unless the URL asks for
    ``workflowType=machine_learning``, the view with runs, params, metrics and Compare."""
    page = f"/{tab}" if tab else ""
    return f"{mlflow_ui_address(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}{page}?workflowType=machine_learning"


def mlflow_view_url(tracking_uri: str, experiment_id: str) -> str:
    """Where the MLflow UI lists the experiment's flow runs with their headline metrics (its saved view ``VIEW_ID``,
    ``tasks.runtime.tracking.ExperimentView``)."""
    return (f"{mlflow_ui_address(tracking_uri)}/#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_ID}"
            "&workflowType=machine_learning")


MLFLOW_UI_ENV = "GPUFLOWS_MLFLOW_UI_URL"
"""Where ``mlflow ui`` serves a local store (default ``http://127.0.0.1:5000``, its default port): the Makefile sets
it from ``MLFLOW_PORT``, so the links a run publishes open the UI ``make mlflow-ui MLFLOW_PORT=...`` serves."""


def mlflow_ui_address(tracking_uri: str) -> str:
    """The MLflow UI of a store: the tracking server itself, or ``mlflow ui`` where ``GPUFLOWS_MLFLOW_UI_URL`` says
    (default its default port). A link written at run time must name the port the user will serve the UI on."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return (os.environ.get(MLFLOW_UI_ENV) or "http://127.0.0.1:5000").rstrip("/")


def _link_markdown(uri: str, experiment: str, experiment_id: str, run_id: str, run_name: str) -> str:
    """The ``mlflow-run`` artifact's text: the MLflow run by name, linked, the experiment's flow runs side by side
    (``tasks.runtime.tracking.ExperimentView``), and how to serve a local store."""
    url = mlflow_run_url(uri, experiment_id, run_id)
    runs = mlflow_view_url(uri, experiment_id)
    port = urlsplit(mlflow_ui_address(uri)).port
    served = "" if uri.startswith(("http://", "https://")) else (
        f"\n\nThe store is `{uri}`: serve it with `mlflow ui --backend-store-uri {uri}"
        f"{f' --port {port}' if port and port != 5000 else ''}`, then open the link.")
    return (f"**MLflow run** [{run_name}]({url}) — run `{run_id}` in experiment `{experiment}` (id {experiment_id}); "
            f"its tags `prefect.flow_run_id` and `prefect.flow_run_url` point back to this flow run. "
            f"[All flow runs of {experiment}, headline metrics first]({runs}).{served}")


# MLflow run id -> (the ``mlflow-run`` artifact's id, the link's other fields), so the link can follow the run's
# readable name once ``log_flow_inputs`` gives it one.
_LINKS: dict[str, tuple[Any, tuple[str, str, str]]] = {}


def publish_mlflow_link(runner: PlacingTaskRunner | None = None) -> str | None:
    """Open the flow run's MLflow run (the runner's) and attach a link to it as the markdown artifact
    ``mlflow-run`` of this flow run; returns the MLflow run id (None when tracking is off)."""
    runner = runner or flow_runner()
    if runner is None or not runner.tracking.enabled:
        return None
    run_id = flow_mlflow_run_id()
    if run_id is None:
        return None
    from mlflow import MlflowClient
    from prefect.artifacts import create_markdown_artifact

    uri = runner.tracking.resolved_uri()
    run = MlflowClient(uri).get_run(run_id)
    fields = (uri, runner.tracking.resolved_experiment(), run.info.experiment_id)
    artifact_id = create_markdown_artifact(
        _link_markdown(*fields, run_id, run.info.run_name), key="mlflow-run",
        description="The MLflow run of this flow run (per-task placements, metrics, models)")
    _LINKS[run_id] = (artifact_id, fields)
    return run_id


def _rename_link(run_id: str, run_name: str) -> None:
    """Show the MLflow run's new name in this flow run's ``mlflow-run`` artifact (published before the rename)."""
    if run_id not in _LINKS:
        return
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactUpdate

    artifact_id, fields = _LINKS.pop(run_id)
    with get_client(sync_client=True) as client:
        client.update_artifact(artifact_id, ArtifactUpdate(data=_link_markdown(*fields, run_id, run_name)))


def settings(parameters: dict[str, Any], default_pool: GpuPool | None = None, experiment: str | None = None,
             **extra: Any) -> dict[str, Any]:
    """Runner settings from a flow's ``pool``/``mode``/``tracking`` parameters (a ``configure`` hook's body);
    ``extra``: settings of the flow's own, e.g. ``workers_per_device_set`` or a system's ``admission``
    (``tasks.salus.admission.salus_settings`` reads Salus's from the same parameters)."""
    out = {"pool": pool_block(parameters.get("pool"), default_pool),
           "tracking": tracking_target(parameters.get("tracking"), experiment)}
    if parameters.get("mode") in MODES:  # a bad mode is the flow's own check to report
        out["mode"] = parameters["mode"]
    return {**out, **extra}


def where_runs_went() -> str:
    """One line naming where this process's Prefect runs and MLflow runs were recorded, and how to look."""
    from prefect.settings import PREFECT_API_URL, get_current_settings

    api = PREFECT_API_URL.value()
    prefect = (f"Prefect runs: the server at {api}" if api else
               f"Prefect runs: PREFECT_HOME={get_current_settings().home} (see them with `make server`, "
               "then http://127.0.0.1:4200)")
    uri = default_tracking_uri()
    return f"{prefect}; MLflow runs: {uri} (`make mlflow-ui`, then {mlflow_ui_address(uri)})"


def current_run_name(identity: RunIdentity) -> str:
    """The name of the flow run in progress when its flow names it (``run_namer``), else ``identity``'s now."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    named = ctx is not None and ctx.flow_run is not None and ctx.flow.flow_run_name is not None
    return ctx.flow_run.name if named else identity.run_name()


# Flow run id -> the headline metrics of its system's view (``log_flow_inputs``), which ``log_flow_outcome``'s log
# line names first.
_HEADLINES: dict[str, tuple[str, ...]] = {}


def _flow_run_id() -> str | None:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx is not None and ctx.flow_run is not None else None


def log_flow_inputs(identity: RunIdentity, params: dict[str, Any], view: ExperimentView | None = None) -> None:
    """The flow's decision inputs as params of its MLflow run, so runs of one system's experiment compare side by
    side; the run is named like the flow run (``run_namer``), or by ``identity`` for a flow without a namer;
    ``view``: how the system's experiment opens in the MLflow UI (``tasks.runtime.tracking.ExperimentView``), whose
    headline metrics also lead the outcome's log line (``log_flow_outcome``). MLflow's part is a no-op when tracking
    is off."""
    run = _flow_run_id()
    if view is not None and run is not None:
        _HEADLINES[run] = view.metrics
    tracker = flow_tracker()
    if tracker is None:
        return
    run_name = current_run_name(identity)
    tracker.log_flow_inputs({"system": identity.system, **params}, run_name=run_name, view=view)
    if tracker.parent_run_id is not None and run_name != tracker.run_name:
        _rename_link(tracker.parent_run_id, run_name)


def outcome_line(metrics: dict[str, Any], headline: tuple[str, ...] = ()) -> str:
    """The outcome as one log line, the system's headline metrics first (its view's columns), every other metric
    after them: ``outcome: mean_accuracy=0.881, windows_failed=0; tasks=19``."""
    def shown(keys: list[str]) -> str:
        return ", ".join(f"{k}={metrics[k]:.4g}" if isinstance(metrics[k], float) else f"{k}={metrics[k]}"
                         for k in keys)

    first = [k for k in headline if k in metrics]
    rest = [k for k in metrics if k not in first]
    return "outcome: " + "; ".join(part for part in (shown(first), shown(rest)) if part)


def log_flow_outcome(metrics: dict[str, Any]) -> None:
    """The flow's headline outcome as metrics of its MLflow run (tracking on) and as one line of the flow run's
    logs: the Logs tab is where the Prefect UI opens a flow run, so the answer shows there, tracking on or off."""
    run = _flow_run_id()
    line = outcome_line(metrics, _HEADLINES.pop(run, ()) if run is not None else ())
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        get_run_logger().info(line)
    except MissingContextError:  # outside a run (a script's own call): the module's logger
        logging.getLogger(__name__).info(line)
    tracker = flow_tracker()
    if tracker is not None:
        tracker.log_flow_outcome(metrics)
