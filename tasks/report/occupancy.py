"""Who held which slice of a pool when: the occupancy chart a flow publishes at its end.

One chart per pool from the ledger's ``events`` table: one lane per device (``node/gpuN``), x = seconds, each
lease a bar whose height is its share of the device, stacked when slices share a device, coloured by holder
(the flow run that held it where known, ``tasks.report.holders``, else the holder's pid) and labelled with the
lease label (task name, or the stream/trial the flow put in ``gpu_options(label=...)``). It shows every flow's
leases on the pool in the time window, so one flow's chart also shows its neighbours.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from prefect.context import FlowRunContext

from tasks.report.charts import publish_chart
from tasks.report.holders import holder_names, mlflow_holder_names, register_holder
from tasks.runtime.flow import flow_runner
from tasks.runtime.png import DPI, WIDTH_IN, pyplot, save_png
from tasks.runtime.runners import flow_mlflow_run_id

log = logging.getLogger(__name__)

_END_KINDS = ("release", "reclaim")
OCCUPANCY = "pool-occupancy"  # the occupancy chart's artifact key and file name, one for every pool and policy


def lease_intervals(events: Iterable[Mapping[str, Any]], since_t: float | None = None,
                    until_t: float | None = None) -> list[dict[str, Any]]:
    """Leases from ledger events (``PoolLedger.events()``): allocate paired with its release/reclaim.

    A lease still held at ``until_t`` (default: now) ends there (``open``: True); leases wholly outside
    ``[since_t, until_t]`` are left out, the others clipped to it. ``devices`` may be a JSON text (the
    events table) or a sequence.
    """
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
    ax.set_xlabel(f"wall-clock seconds since {start_clock} (this machine's time, not a flow's slice time)",
                  fontsize=11)
    ax.set_ylabel("device\n(bar height = share held)", fontsize=11)
    busy = sum((x["end"] - x["start"]) * min(1.0, x["fraction"] or 1.0) * len(x["devices"]) for x in leases)
    util = busy / (span * max(1, len(lanes)))
    ax.set_title(f"Pool {pool or '?'}: GPU slices held by every flow, in wall-clock time\n{len(leases)} leases by "
                 f"{len(holders)} holder(s); slices held {util:.0%} of the pool's device-seconds", fontsize=13)
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


def publish_pool_occupancy(runner: Any = None, since_t: float | None = None) -> Path | None:
    """At a flow's end: the occupancy chart of the runner's pool since ``since_t`` (default: the flow run's
    start), as artifact ``pool-occupancy`` and ``charts/pool-occupancy.png`` of the flow's MLflow run: the
    same name in every run whatever its pool or policy (the pool is in the chart's title), so MLflow's
    Compare view puts two runs' charts side by side. ``runner``: the flow's GPU task runner (default: the current
    flow run's). Returns the PNG (None without a GPU task runner or when the chart could not be drawn; failures
    are logged, never raised)."""
    try:
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
            run_id = flow_mlflow_run_id()
        publish_chart(path, OCCUPANCY, f"Pool {pool}: occupancy during this flow run",
                      "One lane per device; each bar a lease (label: task or stream), its height the share of the "
                      "device, its colour the flow run that held it — other flows' leases on this pool included. "
                      "In wall-clock time: the share of device-seconds held counts start-up and waits too, so it "
                      "reads lower than a flow's own charts in slice time (e.g. Ekya's GPU split per window).",
                      run_id, runner.tracking.resolved_uri() if run_id else None)
        return path
    except Exception as exc:  # noqa: BLE001
        log.warning("could not chart the pool's occupancy: %r", exc)
        return None
