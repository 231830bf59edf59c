"""Charts a reviewer reads: who held which slice of a pool when, Ekya's GPU split, Cilantro's rounds, Salus's lanes.

Every chart is a small PNG (matplotlib, Agg backend, 100 dpi, 1100 px wide: the Prefect UI's artifact pane in a
1600 px window shows it at full size, so its 10-13 pt text stays readable) that goes
two places: the flow run's Prefect UI (a markdown artifact embedding the PNG as a data URI, so it shows on the
run's Artifacts tab without a file server) and the flow's MLflow run (``charts/<name>.png``).

* :func:`occupancy_png` — one chart per pool from the ledger's ``events`` table: one lane per device
  (``node/gpuN``), x = seconds, each lease a bar whose height is its share of the device, stacked when slices
  share a device, coloured by holder (the flow run that held it where known, else the holder's pid) and
  labelled with the lease label (task name, or the stream/trial the flow put in ``gpu_options(label=...)``).
  It shows every flow's leases on the pool in the time window, so one flow's chart also shows its neighbours.
* :func:`ekya_split_png` — per window, the GPUs each stream got for inference and retraining, beside the
  accuracy each stream measured.
* :func:`cilantro_rounds_png` — per round, each job's allocation and the utility it measured.
* :func:`salus_lanes_png` — per job, its queuing and a bar per Salus iteration, coloured by lane.

:func:`publish_pool_occupancy` is what a flow calls at its end. Holders are named through a small registry
(``<state dir>/pool_holders.db``): each flow run registers its ledger owner key under its run name when it
publishes, so holders that published before are named; a holder still running is named by the MLflow run its
task runner opened (tags ``gpuflows.host``/``gpuflows.pid``, name = the flow run's) when exactly one such run
overlaps its leases, else shown by pid.
"""

from __future__ import annotations

import base64
import logging
import math
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

log = logging.getLogger(__name__)

DPI = 100
WIDTH_IN = 11.0           # 1100 px at DPI: the artifact pane of the Prefect UI at a 1600 px window
MAX_INLINE_BYTES = 400_000  # larger PNGs are not embedded in the Prefect artifact (MLflow still gets them)
_END_KINDS = ("release", "reclaim")
OCCUPANCY = "pool-occupancy"  # the occupancy chart's artifact key and file name, one for every pool and policy


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend: charts are drawn to files, on machines without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# -- occupancy --------------------------------------------------------------------------------------------
def lease_intervals(events: Iterable[Mapping[str, Any]], since_t: float | None = None,
                    until_t: float | None = None) -> list[dict[str, Any]]:
    """Leases from ledger events (``PoolLedger.events()``): allocate paired with its release/reclaim.

    A lease still held at ``until_t`` (default: now) ends there (``open``: True); leases wholly outside
    ``[since_t, until_t]`` are left out, the others clipped to it. ``devices`` may be a JSON text (the
    events table) or a sequence.
    """
    import json

    until_t = time.time() if until_t is None else until_t
    open_: dict[str, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for e in sorted(events, key=lambda e: (e["t"], e.get("id", 0))):
        if e["kind"] == "allocate":
            devices = e.get("devices") or []
            if isinstance(devices, str):
                devices = json.loads(devices)
            open_[e["lease_id"]] = {"lease_id": e["lease_id"], "label": e.get("label") or "", "node": e.get("node"),
                                    "devices": [int(d) for d in devices], "fraction": float(e.get("fraction") or 0),
                                    "memory": e.get("memory") or 0, "holder": e.get("holder") or "",
                                    "start": float(e["t"]), "end": None, "end_kind": None, "open": False}
        elif e["kind"] in _END_KINDS and e["lease_id"] in open_:
            lease = open_.pop(e["lease_id"])
            lease.update(end=float(e["t"]), end_kind=e["kind"])
            done.append(lease)
    for lease in open_.values():
        lease.update(end=until_t, open=True)
        done.append(lease)
    lo = -math.inf if since_t is None else since_t
    out = []
    for lease in done:
        if lease["end"] < lo or lease["start"] > until_t or not lease["devices"]:
            continue
        out.append({**lease, "start": max(lease["start"], lo), "end": min(lease["end"], until_t)})
    return sorted(out, key=lambda x: (x["start"], x["lease_id"]))


def holder_pid(holder: str) -> str:
    """``host:pid:token`` -> ``pid``."""
    parts = holder.split(":")
    return parts[1] if len(parts) >= 3 else holder


def _lanes(spec: Any, leases: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """Every device of the pool (``PoolSpec.nodes`` or ``NodeState`` list), and any the events name besides."""
    lanes: list[tuple[str, int]] = []
    nodes = getattr(spec, "nodes", spec) or []
    for n in nodes:
        lanes += [(n.name, d.index) for d in n.devices]
    for lease in leases:
        lanes += [(lease["node"], d) for d in lease["devices"] if (lease["node"], d) not in lanes]
    return lanes


def _stack(leases: list[dict[str, Any]]) -> dict[tuple[str, str, int], float]:
    """Vertical offset of each lease on each of its devices: the lowest free band of its height."""
    offsets: dict[tuple[str, str, int], float] = {}
    active: dict[tuple[str, int], list[tuple[float, float, float]]] = {}  # lane -> (end, offset, height)
    for lease in leases:
        h = min(1.0, lease["fraction"] or 1.0)
        for d in lease["devices"]:
            lane = (lease["node"], d)
            busy = sorted((o, o + hh) for end, o, hh in active.get(lane, []) if end > lease["start"] + 1e-9)
            offset = 0.0
            for lo, hi in busy:
                if offset + h <= lo + 1e-9:
                    break
                offset = max(offset, hi)
            offset = min(offset, max(0.0, 1.0 - h))  # never above the lane (an over-commit would show as overlap)
            active[lane] = [a for a in active.get(lane, []) if a[0] > lease["start"] + 1e-9] + [(lease["end"], offset, h)]
            offsets[(lease["lease_id"], lane[0], d)] = offset
    return offsets


def occupancy_figure(events: Iterable[Mapping[str, Any]], spec: Any = None, *, names: Mapping[str, str] | None = None,
                     pool: str = "", since_t: float | None = None, until_t: float | None = None,
                     highlight: str | None = None):
    """The occupancy chart as a matplotlib Figure (see :func:`occupancy_png`); the caller closes it."""
    plt = pyplot()
    from matplotlib.patches import Patch

    until_t = time.time() if until_t is None else until_t
    leases = lease_intervals(events, since_t, until_t)
    lanes = _lanes(spec, leases)
    t0 = since_t if since_t is not None else min((x["start"] for x in leases), default=until_t)
    span = max(until_t - t0, 1e-3)
    names = dict(names or {})
    holders = list(dict.fromkeys(x["holder"] for x in leases))

    def holder_name(h: str) -> str:
        name = names.get(h) or f"pid {holder_pid(h)}"
        if names.get(h):
            name += f" (pid {holder_pid(h)})"
        return name + (" — this flow" if h == highlight else "")

    cmap = plt.get_cmap("tab10" if len(holders) <= 10 else "tab20")
    colour = {h: cmap(i % cmap.N) for i, h in enumerate(holders)}
    lane_h = 0.9
    fig, ax = plt.subplots(figsize=(WIDTH_IN, max(4.0, 2.4 + 0.9 * len(lanes))), dpi=DPI, layout="constrained")
    index = {lane: i for i, lane in enumerate(lanes)}
    offsets = _stack(leases)
    axes_px = WIDTH_IN * DPI * 0.86  # plot area width (the legend is below it)
    for lease in leases:
        for d in lease["devices"]:
            i = index[(lease["node"], d)]
            h = min(1.0, lease["fraction"] or 1.0) * lane_h
            y = i - lane_h / 2 + offsets[(lease["lease_id"], lease["node"], d)] * lane_h
            x, w = lease["start"] - t0, max(lease["end"] - lease["start"], span * 1e-4)
            ax.broken_barh([(x, w)], (y, h), facecolors=colour[lease["holder"]], edgecolors="black", linewidth=0.4,
                           alpha=0.85, hatch="//" if lease["open"] else None)
            width_px, height_px = w / span * axes_px, h / len(lanes) * (fig.get_figheight() * DPI - 150)
            text = lease["label"] or lease["lease_id"][:6]
            if lease["end_kind"] == "reclaim":
                text += " (reclaimed)"
            if width_px > 6.5 * len(text) + 4 and height_px >= 11:
                ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9, clip_on=True)
            elif width_px > 6.5 * 5 and height_px >= 11:
                ax.text(x + w / 2, y + h / 2, text[: max(1, int((width_px - 4) / 6.5) - 1)] + "…", ha="center",
                        va="center", fontsize=9, clip_on=True)
    ax.set_yticks(range(len(lanes)), [f"{n}/gpu{d}" for n, d in lanes], fontsize=10)
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # gpu0 on top
    ax.set_xlim(0, span)
    ax.grid(axis="x", color="0.85", lw=0.6)
    ax.set_axisbelow(True)
    start_clock = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t0))
    ax.set_xlabel(f"seconds since {start_clock}", fontsize=11)
    ax.set_ylabel("device\n(bar height = share held)", fontsize=11)
    busy = sum((x["end"] - x["start"]) * min(1.0, x["fraction"] or 1.0) * len(x["devices"]) for x in leases)
    util = busy / (span * max(1, len(lanes)))
    ax.set_title(f"Pool {pool or '?'}: GPU slices held by every flow\n{len(leases)} leases by {len(holders)} "
                 f"holder(s), mean occupancy {util:.0%}", fontsize=13)
    handles = [Patch(facecolor=colour[h], edgecolor="black", label=holder_name(h)) for h in holders]
    if any(x["open"] for x in leases):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="still held at the chart's end"))
    if handles:
        fig.legend(handles=handles, title="holder (flow run)", loc="outside lower center",
                   ncol=min(3, len(handles)), fontsize=10, title_fontsize=10, frameon=False)
    else:
        ax.text(0.5, 0.5, "no slice was held in this time window", transform=ax.transAxes, ha="center",
                va="center", fontsize=12, color="0.4")
    return fig


def occupancy_png(events: Iterable[Mapping[str, Any]], spec: Any, path: str | Path | None = None, **kwargs) -> Path:
    """Write the pool's occupancy chart (``occupancy_figure``'s keyword arguments: names, pool, since_t,
    until_t, highlight) to ``path`` (default: a temporary file); returns the path."""
    return save_png(occupancy_figure(events, spec, **kwargs), path, "occupancy.png")


def save_png(fig, path: str | Path | None, default_name: str = "chart.png", dpi: int = DPI) -> Path:
    """Write ``fig`` as a PNG to ``path`` (its folder made; default: ``default_name`` in a new temporary folder)
    and close it, so a flow or benchmark drawing many charts does not keep them all in memory."""
    plt = pyplot()
    path = Path(path) if path else Path(tempfile.mkdtemp(prefix="gpuflows-chart-")) / default_name
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path


# -- Ekya ------------------------------------------------------------------------------------------------
def ekya_split_figure(windows: Sequence[Mapping[str, Any]], title: str = ""):
    """``windows``: ``{"window", "split": {"<stream>/infer" | "<stream>/train": GPUs}, "accuracy": {stream: measured},
    "predicted": {stream: expected}}`` per window. Left: stacked GPUs per window (solid inference, hatched
    retraining, a colour per stream); right: measured (solid) and predicted (dashed) accuracy per stream."""
    plt = pyplot()
    from matplotlib.patches import Patch

    streams = sorted({s for w in windows for s in w["accuracy"]})
    colour = {s: f"C{i % 10}" for i, s in enumerate(streams)}
    xs = [w["window"] for w in windows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(WIDTH_IN, 5.6), dpi=DPI, layout="constrained")
    bottom = [0.0] * len(windows)
    for s in streams:
        for kind, hatch in (("infer", None), ("train", "//")):
            vals = [float(w["split"].get(f"{s}/{kind}", 0.0)) for w in windows]
            left.bar(xs, vals, bottom=bottom, color=colour[s], hatch=hatch, edgecolor="black", linewidth=0.5,
                     alpha=0.6 if kind == "train" else 0.9, width=0.6)
            for x, b, v in zip(xs, bottom, vals):
                if v >= 0.12 and len(xs) <= 6:
                    left.text(x, b + v / 2, f"{v:.2f}", ha="center", va="center", fontsize=9)
            bottom = [b + v for b, v in zip(bottom, vals)]
    left.set(xlabel="window", ylabel="GPUs at the window's start", xticks=xs,
             title="GPU split per stream\n(solid: inference, hatched: retraining)")
    left.legend(handles=[Patch(facecolor=colour[s], label=s) for s in streams]
                + [Patch(facecolor="white", edgecolor="black", hatch="//", label="retraining")],
                loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(5, len(streams) + 1), fontsize=10,
                frameon=False)
    for s in streams:
        right.plot(xs, [w["accuracy"].get(s) for w in windows], marker="o", color=colour[s], label=f"{s} measured")
        if any(w.get("predicted") for w in windows):
            right.plot(xs, [(w.get("predicted") or {}).get(s) for w in windows], marker="x", ls="--", lw=1,
                       color=colour[s], label=f"{s} predicted")
    means = [sum(w["accuracy"].values()) / max(1, len(w["accuracy"])) for w in windows]
    right.plot(xs, means, color="black", lw=2.5, marker="s", label="mean measured")
    right.set(xlabel="window", ylabel="inference accuracy", ylim=(0, 1.02), xticks=xs,
              title="accuracy per stream and window\n(solid: measured, dashed: predicted)")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=10, frameon=False)
    fig.suptitle(title or "Ekya: GPU split beside accuracy", fontsize=13)
    return fig


def ekya_split_png(windows: Sequence[Mapping[str, Any]], path: str | Path | None = None, title: str = "") -> Path:
    """Write :func:`ekya_split_figure` to ``path`` (default: a temporary file)."""
    return save_png(ekya_split_figure(windows, title), path, "ekya-split.png")


# -- Cilantro ----------------------------------------------------------------------------------------------
def cilantro_rounds_figure(rows: Sequence[Mapping[str, Any]], title: str = ""):
    """``rows``: ``{"round", "allocation": {job: GPUs}, "utilities": {job: u}, "failed": [job]}`` per round. Left:
    each job's allocation per round (stacked); right: each job's utility per round (failed rounds marked x)."""
    plt = pyplot()

    jobs = list(dict.fromkeys(j for r in rows for j in r.get("allocation", {})))
    colour = {j: f"C{i % 10}" for i, j in enumerate(jobs)}
    xs = [r["round"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(WIDTH_IN, 5.0), dpi=DPI, layout="constrained")
    bottom = [0.0] * len(rows)
    for j in jobs:  # bars, not areas: an allocation holds for its whole round
        vals = [float(r["allocation"].get(j, 0.0)) for r in rows]
        left.bar(xs, vals, bottom=bottom, color=colour[j], width=0.7, edgecolor="black", linewidth=0.4, label=j)
        for x, b, v in zip(xs, bottom, vals):
            if v >= 0.08 and len(xs) <= 10:
                left.text(x, b + v / 2, f"{v:.2f}", ha="center", va="center", fontsize=9)
        bottom = [b + v for b, v in zip(bottom, vals)]
    left.set(xlabel="round", ylabel="GPUs allotted", title="allocation per job per round", xticks=xs)
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(4, len(jobs)), fontsize=10,
                frameon=False)
    for j in jobs:
        ys = [(r.get("utilities") or {}).get(j) for r in rows]
        right.plot(xs, [math.nan if y is None else y for y in ys], marker="o", color=colour[j], label=j)
        failed = [(x, 0.0) for x, r in zip(xs, rows) if j in (r.get("failed") or [])]
        if failed:
            right.scatter(*zip(*failed), marker="x", s=80, color=colour[j], zorder=3)
    right.set(xlabel="round", ylabel="utility (x: the job's task failed)", title="utility per job per round",
              xticks=xs)
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(4, len(jobs)), fontsize=10,
                 frameon=False)
    fig.suptitle(title or "Cilantro allocation rounds", fontsize=13)
    return fig


def cilantro_rounds_png(rows: Sequence[Mapping[str, Any]], path: str | Path | None = None, title: str = "") -> Path:
    """Write :func:`cilantro_rounds_figure` to ``path`` (default: a temporary file)."""
    return save_png(cilantro_rounds_figure(rows, title), path, "cilantro-rounds.png")


# -- Salus -------------------------------------------------------------------------------------------------
def salus_lanes_figure(jobs: Sequence[Mapping[str, Any]], title: str = ""):
    """``jobs``: ``{"job", "lane", "arrival_s", "spans": [(start_s, end_s), ...]}`` per job (optionally
    ``span_lanes``, each iteration's lane when a job changed lanes). One row per job (first
    arrival on top): a grey line from its arrival to its first iteration (queuing), then a bar per iteration,
    coloured by the lane it ran in — bars of one colour never overlap (one iteration at a time per lane)."""
    plt = pyplot()
    from matplotlib.patches import Patch

    per_span = [j.get("span_lanes") or [j["lane"]] * len(j["spans"]) for j in jobs]
    lanes = sorted({lane for ls in per_span for lane in ls})
    cmap = plt.get_cmap("tab10" if len(lanes) <= 10 else "tab20")
    colour = {lane: cmap(i % cmap.N) for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(WIDTH_IN, max(3.0, 1.6 + 0.35 * len(jobs))), dpi=DPI, layout="constrained")
    for row, (j, span_lanes) in enumerate(zip(jobs, per_span)):
        spans = [(s, e - s) for s, e in j["spans"]]
        if spans:
            ax.hlines(row, j["arrival_s"], spans[0][0], colors="0.6", linewidth=1.5)
        ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=[colour[lane] for lane in span_lanes],
                       edgecolors="black", linewidth=0.2)
    ax.set_yticks(range(len(jobs)), [f"{j['job']} {j.get('workload', '')}".strip() for j in jobs], fontsize=9)
    ax.set_ylim(len(jobs) - 0.5, -0.5)
    ax.set_xlabel("seconds since the first arrival", fontsize=11)
    ax.grid(axis="x", color="0.85", lw=0.6)
    ax.set_axisbelow(True)
    ax.set_title(title or "Salus lanes: iterations per job", fontsize=12)
    fig.legend(handles=[Patch(facecolor=colour[lane], edgecolor="black", label=f"lane {lane}") for lane in lanes]
               + [Patch(facecolor="0.6", label="queued (arrival to first iteration)")],
               loc="outside lower center", ncol=min(6, len(lanes) + 1), fontsize=10, frameon=False)
    return fig


def salus_lanes_png(jobs: Sequence[Mapping[str, Any]], path: str | Path | None = None, title: str = "") -> Path:
    """Write :func:`salus_lanes_figure` to ``path`` (default: a temporary file)."""
    return save_png(salus_lanes_figure(jobs, title), path, "salus-lanes.png")


# -- publishing ----------------------------------------------------------------------------------------------
def publish_chart(path: Path, key: str, title: str, description: str, mlflow_run_id: str | None = None,
                  tracking_uri: str | None = None) -> None:
    """The PNG as the markdown artifact ``key`` of the current flow run (embedded as a data URI) and, given a
    run, as ``charts/<file>`` of that MLflow run. Either half failing is logged, never raised: a chart must
    not fail a flow that did its work."""
    data = Path(path).read_bytes()
    try:
        from prefect.artifacts import create_markdown_artifact
        from prefect.context import FlowRunContext

        if FlowRunContext.get() is not None:
            where = _mlflow_where(Path(path).name, mlflow_run_id, tracking_uri)
            body = (f"![{title}](data:image/png;base64,{base64.b64encode(data).decode()})"
                    if len(data) <= MAX_INLINE_BYTES else f"*(chart of {len(data) // 1024} KiB: too big to embed)*")
            create_markdown_artifact(f"### {title}\n\n{body}\n\n{where}", key=key,
                                     description=description)
    except Exception as exc:  # noqa: BLE001
        log.warning("could not publish chart %s to Prefect: %r", key, exc)
    if mlflow_run_id and tracking_uri:
        try:
            from mlflow import MlflowClient

            MlflowClient(tracking_uri).log_artifact(mlflow_run_id, str(path), "charts")
        except Exception as exc:  # noqa: BLE001
            log.warning("could not log chart %s to MLflow run %s: %r", key, mlflow_run_id, exc)


def _mlflow_where(name: str, run_id: str | None, tracking_uri: str | None) -> str:
    """The line under a chart saying where MLflow keeps it: a link to the run's artifacts when the run's
    experiment can be read (the MLflow UI URL of ``tasks.runtime.flow.mlflow_run_url``), else the run id."""
    if not run_id:
        return ""
    run = f"`{run_id}`"
    if tracking_uri:
        try:
            from mlflow import MlflowClient

            from tasks.runtime.flow import mlflow_run_url

            got = MlflowClient(tracking_uri).get_run(run_id)
            run = f"[{got.info.run_name}]({mlflow_run_url(tracking_uri, got.info.experiment_id, run_id, 'artifacts')})"
        except Exception as exc:  # noqa: BLE001 - the id then
            log.debug("MLflow run %s not read for the chart's link: %r", run_id, exc)
    return f"Also `charts/{name}` of MLflow run {run}."


def _registry() -> sqlite3.Connection:
    from gpu.state import state_dir

    path = state_dir() / "pool_holders.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30)
    db.execute("CREATE TABLE IF NOT EXISTS holders (holder TEXT PRIMARY KEY, flow_run TEXT, pool TEXT, t REAL)")
    return db


def register_holder(holder: str, flow_run: str, pool: str) -> None:
    """Remember that ledger owner ``holder`` was flow run ``flow_run`` (for later charts of ``pool``)."""
    with _registry() as db:
        db.execute("INSERT OR REPLACE INTO holders VALUES (?,?,?,?)", (holder, flow_run, pool, time.time()))


def holder_names(holders: Iterable[str]) -> dict[str, str]:
    """Flow run names of the holders registered so far (others are absent)."""
    wanted = list(set(holders))
    if not wanted:
        return {}
    with _registry() as db:
        rows = db.execute(f"SELECT holder, flow_run FROM holders WHERE holder IN ({','.join('?' * len(wanted))})",
                          wanted).fetchall()
    return dict(rows)


def mlflow_holder_names(holders: Iterable[str], leases: list[dict[str, Any]], tracking_uri: str) -> dict[str, str]:
    """Names for holders on this host from the MLflow runs their task runners opened: a flow's parent run
    carries its process's host and pid (``tasks.runtime.tracking.holder_tags``) and is named like its flow run. A
    holder is named only when exactly one such run of its pid overlaps its leases."""
    from mlflow import MlflowClient

    from gpu.liveness import HOST
    from tasks.runtime.tracking import HOST_TAG, PID_TAG

    client, out = MlflowClient(tracking_uri), {}
    experiments = [e.experiment_id for e in client.search_experiments()]
    for holder in set(holders):
        host, _, rest = holder.partition(":")
        pid = rest.partition(":")[0]
        mine = [x for x in leases if x["holder"] == holder]
        if host != HOST or not pid.isdigit() or not mine or not experiments:
            continue
        lo, hi = min(x["start"] for x in mine) * 1000, max(x["end"] for x in mine) * 1000
        runs = client.search_runs(experiments, f"tags.`{HOST_TAG}` = '{HOST}' and tags.`{PID_TAG}` = '{pid}'",
                                  max_results=200)
        parents = {r.info.run_name for r in runs if "mlflow.parentRunId" not in r.data.tags
                   and r.info.start_time <= hi and (r.info.end_time or math.inf) >= lo}
        if len(parents) == 1:
            out[holder] = parents.pop()
    return out


def publish_pool_occupancy(runner: Any = None, since_t: float | None = None) -> Path | None:
    """At a flow's end: the occupancy chart of the runner's pool since ``since_t`` (default: the flow run's
    start), as artifact ``pool-occupancy`` and ``charts/pool-occupancy.png`` of the flow's MLflow run: the
    same name in every run whatever its pool or policy (the pool is in the chart's title), so MLflow's
    Compare view puts two runs' charts side by side. ``runner``: the flow's GPU task runner (default: the current flow run's). Returns the PNG (None
    without a GPU task runner or when the chart could not be drawn; failures are logged, never raised)."""
    try:
        from prefect.context import FlowRunContext

        from tasks.runtime.flow import flow_runner

        runner = runner or flow_runner()
        if runner is None:
            return None
        ctx = FlowRunContext.get()
        run = ctx.flow_run if ctx else None
        if since_t is None:
            start = run and (run.start_time or run.expected_start_time)
            since_t = start.timestamp() if start else time.time() - 3600
        ledger = runner.ledger()
        pool = runner.pool.name
        own = getattr(getattr(ledger, "owner", None), "key", None)
        if own and run is not None:
            register_holder(own, run.name, pool)
        events = ledger.events()
        until = time.time()
        holders = {e.get("holder") or "" for e in events}
        spec = getattr(ledger, "spec", None) or getattr(ledger, "capacity", None)
        names = holder_names(holders)
        unnamed = holders - set(names)
        if unnamed and runner.tracking.enabled:
            try:
                names.update(mlflow_holder_names(unnamed, lease_intervals(events, since_t, until),
                                                 runner.tracking.resolved_uri()))
            except Exception as exc:  # noqa: BLE001 - a pid then
                log.debug("holders not named from MLflow: %r", exc)
        path = occupancy_png(events, spec, Path(tempfile.mkdtemp(prefix="gpuflows-chart-")) / f"{OCCUPANCY}.png",
                             names=names, pool=pool, since_t=since_t, until_t=until, highlight=own)
        run_id = None
        if runner.tracking.enabled:
            from tasks.runtime.runners import flow_mlflow_run_id

            run_id = flow_mlflow_run_id()
        publish_chart(path, OCCUPANCY, f"Pool {pool}: occupancy during this flow run",
                      "One lane per device; each bar a lease (label: task or stream), its height the share of the "
                      "device, its colour the flow run that held it — other flows' leases on this pool included.",
                      run_id, runner.tracking.resolved_uri() if run_id else None)
        return path
    except Exception as exc:  # noqa: BLE001
        log.warning("could not chart the pool's occupancy: %r", exc)
        return None
