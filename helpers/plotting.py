"""Figures from captured data: data in, ``matplotlib.figure.Figure`` out.

No pyplot state is touched: figures are built with ``Figure()`` under the kit's style file
(``helpers/styles/kit.mplstyle``) applied only for the duration of the call. In a notebook a
returned figure displays as PNG; elsewhere call ``fig.savefig("out.png")``. Memory and
transfers: :func:`memory_timeline`, :func:`snapshot_bars`, :func:`transfer_summary`. Measured
results: :func:`request_vs_budget`, :func:`load_strategy_costs`, :func:`feeding_rates`,
:func:`allocator_settings`, :func:`pipeline_timeline`, :func:`step_peaks`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import TYPE_CHECKING

import matplotlib.style
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from helpers._internal.jaxcompat import device_name
from helpers.errors import BadInputError
from helpers.units import format_bytes

if TYPE_CHECKING:  # records by name only: drawing never imports a capture module
    from matplotlib.axis import Axis

    from helpers.allocation import AllocatorMeasurement
    from helpers.memory import MemorySnapshot, MemoryTrace
    from helpers.transfers import TransferLog

__all__ = ["STYLE", "allocator_settings", "bytes_axis", "feeding_rates", "figure",
           "load_strategy_costs", "memory_timeline", "pipeline_timeline", "request_vs_budget",
           "snapshot_bars", "step_peaks", "transfer_summary"]

STYLE = str(resources.files("helpers") / "styles" / "kit.mplstyle")
_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _unit_for(max_bytes: float) -> tuple[int, str]:
    for factor, name in _UNITS:
        if max_bytes >= factor:
            return factor, name
    return 1, "B"


def bytes_axis(axis: Axis, max_bytes: float) -> tuple[int, str]:
    """Pick one binary unit from the data; plot values divided by the returned factor and the
    axis gets round ticks in that unit. Returns (factor, unit name)."""
    factor, name = _unit_for(max_bytes)
    axis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    return factor, name


def _scaled(values, factor):
    return [None if v is None else v / factor for v in values]


def figure(**kwargs) -> Figure:
    """A pyplot-free Figure with the kit's layout; hold ``matplotlib.style.context(STYLE)``
    around the drawing."""
    fig = Figure(**kwargs)
    fig.set_layout_engine("constrained")
    return fig


# --- memory and transfers ------------------------------------------------------------------

def memory_timeline(trace: MemoryTrace | Mapping, *, title: str = "Memory over time",
                    devices: Sequence[str] | None = None, host: bool = True,
                    labels: Mapping[str, str] | None = None) -> Figure:
    """Step lines per device and host anonymous/file-backed RSS, marks as vertical lines,
    each known device limit as a dashed line, and the allocator's peak (a GPU's
    ``peak_bytes_in_use``) as a thin line above its device, so a peak between samples shows.
    ``trace``: a MemoryTrace or its ``to_dict()``.

    devices: names to draw (default: every device whose bytes changed or are non-zero).
    labels: optional {device name or jax.Device: role}, e.g. {acc: "accelerator (stand-in)"}.
    """
    roles = {device_name(k): v for k, v in (labels or {}).items()}
    data = trace.to_dict() if hasattr(trace, "to_dict") else dict(trace)
    times = data["times"]
    if len(times) < 1:
        raise BadInputError("the trace has no samples; was the track() block entered?")
    series = data["devices"]
    if devices is None:
        names = [n for n, v in series.items() if any(v)]
    else:
        names = [device_name(d) for d in devices]
        unknown = [n for n in names if n not in series]
        if unknown:
            raise KeyError(f"devices {unknown} not in the trace (have {list(series)})")
    has_split = all(v is not None for v in data["host_anon"])
    peak = max([1] + [max(series[n]) for n in names]
               + [data["limits"].get(n) or 0 for n in names])
    if host:
        peak = max(peak, *(data["host_anon"] + data["host_file"]) if has_split
                   else data["host_rss"])
    with matplotlib.style.context(STYLE):
        fig = figure()
        ax = fig.add_subplot()
        factor, unit = bytes_axis(ax.yaxis, peak)
        # wide solid first, then narrower dashed: two devices at the same level both stay visible
        styles = [("-", 3.0), ("--", 1.6), ("-.", 1.4), (":", 1.4)]
        for i, name in enumerate(names):
            src = data["sources"].get(name, "")
            style, width = styles[min(i, len(styles) - 1)]
            line, = ax.step(times, _scaled(series[name], factor), where="post",
                            linestyle=style, linewidth=width,
                            label=f"{name} {roles[name]} ({src})" if name in roles
                            else f"{name} ({src})")
            peaks = (data.get("device_peaks") or {}).get(name) or []
            if any(p is not None for p in peaks):  # the allocator's high-water mark: a peak
                ax.step(times, _scaled([p or 0 for p in peaks], factor), where="post",  # between
                        color=line.get_color(), linewidth=0.9, alpha=0.6,  # samples shows
                        label=f"{name} peak (allocator)")
            limit = data["limits"].get(name)
            if limit:
                ax.axhline(limit / factor, linestyle="--", color=line.get_color(), linewidth=1,
                           label=f"{name} limit {format_bytes(limit)}")
        if host and has_split:
            ax.step(times, _scaled(data["host_anon"], factor), where="post", color="0.25",
                    label="host anonymous")
            ax.step(times, _scaled(data["host_file"], factor), where="post", color="0.6",
                    label="host file-backed")
        elif host:
            ax.step(times, _scaled(data["host_rss"], factor), where="post", color="0.25",
                    label="host RSS")
        for t, label in data["marks"]:
            ax.axvline(t, color="0.4", linewidth=0.8, linestyle=":")
            ax.annotate(label, (t, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                        va="top", ha="right", fontsize=8, color="0.3")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("seconds")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def snapshot_bars(snap: MemorySnapshot, *, title: str = "Memory now") -> Figure:
    """Horizontal bars: bytes in use per device (hatched where counted from live arrays),
    limit as a tick where known, and host anonymous / file-backed RSS."""
    data = snap.to_dict() if hasattr(snap, "to_dict") else dict(snap)
    labels, values, hatches = [], [], []
    for d in data["devices"]:
        labels.append(f"{d['device']}")
        values.append(d["bytes_in_use"])
        hatches.append("//" if d["source"] == "live arrays" else "")
    h = data["host"]
    if h["anon"] is not None:
        labels += ["host anonymous", "host file-backed"]
        values += [h["anon"], h["file"]]
    else:
        labels.append("host RSS")
        values.append(h["rss"])
    hatches += [""] * (len(labels) - len(hatches))
    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(7.5, 0.45 * len(labels) + 1.2))
        ax = fig.add_subplot()
        ys = list(range(len(labels)))[::-1]
        limits = [d["limit_bytes"] or 0 for d in data["devices"]]
        peak = max(values + limits + [1])
        factor, unit = bytes_axis(ax.xaxis, peak * 1.15)
        colors = ["C0"] * len(data["devices"]) + ["0.35"] * (len(labels) - len(data["devices"]))
        bars = ax.barh(ys, _scaled(values, factor), color=colors)
        for bar, hatch in zip(bars, hatches, strict=True):
            bar.set_hatch(hatch)
        for y, limit in zip(ys, limits, strict=False):
            if limit:
                ax.plot([limit / factor] * 2, [y - 0.4, y + 0.4], color="C1", linewidth=2)
        for y, v in zip(ys, values, strict=True):
            ax.annotate(format_bytes(v), (v / factor, y), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=8)
        ax.set_yticks(ys, labels)
        ax.set_xlim(0, peak * 1.15 / factor)
        ax.set_xlabel(unit + "   (hatched: live JAX arrays; bars: allocator)")
        ax.grid(axis="x", alpha=0.3)
        ax.grid(axis="y", visible=False)
        ax.set_title(title)
    return fig


def transfer_summary(log: TransferLog, *, title: str = "Transfers") -> Figure:
    """Two panels: number of transfers and known bytes, per direction, explicit vs implicit.
    Transfers whose size JAX did not log (jit's fast path) are written beside the bytes bar."""
    rows = log.summary() if hasattr(log, "summary") else list(log)
    directions = ["host->device", "device->device", "device->host"]
    kinds = [(True, "explicit", "C0"), (False, "implicit", "C1"), (None, "unknown", "0.6")]
    def per_direction(key, flag):
        return [sum(r[key] for r in rows if r["direction"] == d and r["explicit"] is flag)
                for d in directions]

    stacks = [(name, color, per_direction("count", flag), per_direction("bytes", flag))
              for flag, name, color in kinds]
    stacks = [s for s in stacks if any(s[2])]
    max_b = max([1] + [sum(s[3][i] for s in stacks) for i in range(len(directions))])
    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(7.5, 2.8))
        ax_n, ax_b = fig.subplots(1, 2)
        factor, unit = bytes_axis(ax_b.xaxis, max_b)
        left_n = [0] * 3
        left_b = [0.0] * 3
        for name, color, counts, sizes in stacks:
            scaled = [b / factor for b in sizes]
            ax_n.barh(directions, counts, left=left_n, color=color, label=name)
            ax_b.barh(directions, scaled, left=left_b, color=color, label=name)
            left_n = [a + b for a, b in zip(left_n, counts, strict=True)]
            left_b = [a + b for a, b in zip(left_b, scaled, strict=True)]
        for ax in (ax_n, ax_b):
            ax.invert_yaxis()
            ax.grid(axis="x", alpha=0.3)
            ax.grid(axis="y", visible=False)
        unknown = [sum(r.get("unknown_size", 0) for r in rows if r["direction"] == d)
                   for d in directions]
        for y, (n, b) in enumerate(zip(unknown, left_b, strict=True)):
            if n:
                ax_b.annotate(f"+ {n} of unknown size", (b, y), xytext=(3, 0),
                              textcoords="offset points", va="center", fontsize=8, color="0.3")
        fig.suptitle(title, x=0.02, ha="left", fontweight="bold")
        ax_n.set_title("count", loc="left", fontweight="normal")
        ax_n.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_b.set_xlim(0, max_b * 1.05 / factor)
        ax_b.set_title("known bytes", loc="left", fontweight="normal")
        ax_b.set_xlabel(unit)
        ax_b.set_yticks([])
        if any(left_n):
            ax_n.legend(loc="lower right")
    return fig


# --- measured results ----------------------------------------------------------------------

def request_vs_budget(rows: Iterable[Mapping], *,
                      title: str = "Requested bytes against the budget") -> Figure:
    """One panel per case, each on its own binary-unit scale: the bytes a load requested
    against the memory budget it had (and the device's whole memory, where given).

    rows: iterable of dicts with ``label``, ``requested``, ``budget`` and optionally ``total``.
    """
    rows = list(rows)
    if not rows:
        raise BadInputError("no rows to draw")
    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(7.5, 1.35 * len(rows) + 0.6))
        axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
        for i, (ax, r) in enumerate(zip(axes, rows, strict=True)):
            peak = max(r["requested"], r["budget"], r.get("total") or 0)
            factor, unit = bytes_axis(ax.xaxis, peak)
            fits = r["requested"] <= r["budget"]
            bars = [("requested", r["requested"], "C0" if fits else "C1"),
                    ("budget", r["budget"], "C2")]
            if r.get("total"):
                bars.append(("device memory", r["total"], "0.8"))
            for y, (name, value, color) in enumerate(bars):
                ax.barh(-y, value / factor, color=color, height=0.7)
                note = f"{format_bytes(value)}"
                if name == "requested" and not fits:
                    note += "  - does not fit"
                ax.annotate(note, (value / factor, -y), xytext=(4, 0),
                            textcoords="offset points", va="center", fontsize=8)
            ax.set_yticks([-y for y in range(len(bars))], [b[0] for b in bars])
            ax.set_xlim(0, peak * 1.45 / factor)
            ax.set_xlabel(unit)
            ax.grid(axis="x", alpha=0.3)
            ax.grid(axis="y", visible=False)
            ax.set_title(r["label"] if i else f"{title}\n{r['label']}", fontsize=10)
    return fig


def load_strategy_costs(measurements: Iterable[Mapping], *,
                        title: str = "Loading the token file four ways") -> Figure:
    """Two panels per strategy: wall time, and peak memory above the baseline split into
    anonymous and file-backed RSS, with accelerator bytes written beside each bar.
    ``measurements``: LoadMeasurement objects or their dicts (medians, one per strategy)."""
    rows = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in measurements]
    if not rows:
        raise BadInputError("no measurements to draw")
    names = [r["strategy"] for r in rows]
    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(7.5, 0.55 * len(rows) + 1.6))
        ax_t, ax_m = fig.subplots(1, 2)
        ys = list(range(len(rows)))[::-1]
        ax_t.barh(ys, [r["seconds"] for r in rows], color="C0")
        for y, r in zip(ys, rows, strict=True):
            ax_t.annotate(f"{r['seconds']:.2f} s", (r["seconds"], y), xytext=(3, 0),
                          textcoords="offset points", va="center", fontsize=8)
        ax_t.set_yticks(ys, names)
        ax_t.set_xlabel("seconds (load + one full read)")
        ax_t.set_xlim(0, max(r["seconds"] for r in rows) * 1.3)
        peak = max(r["peak_anon_bytes"] + r["peak_file_bytes"] for r in rows) or 1
        factor, unit = bytes_axis(ax_m.xaxis, peak)
        anon = [r["peak_anon_bytes"] / factor for r in rows]
        file = [r["peak_file_bytes"] / factor for r in rows]
        ax_m.barh(ys, anon, color="0.25", label="anonymous")
        ax_m.barh(ys, file, left=anon, color="0.65", label="file-backed")
        for y, r, a, f in zip(ys, rows, anon, file, strict=True):
            ax_m.annotate(f"{r['peak_anon_bytes'] / r['file_bytes']:.1f}x file anon; "
                          f"accel +{format_bytes(r['accelerator_bytes'])}", (a + f, y),
                          xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
        ax_m.set_yticks([])
        ax_m.set_xlim(0, peak * 1.9 / factor)
        ax_m.set_xlabel(f"peak host memory above baseline ({unit})")
        ax_m.legend(loc="lower right")
        for ax in (ax_t, ax_m):
            ax.grid(axis="x", alpha=0.3)
            ax.grid(axis="y", visible=False)
        ax_t.set_title(title)
    return fig


def feeding_rates(rows: Iterable[Mapping], *, title: str = "Feeding the accelerator") -> Figure:
    """Throughput (GB/s, log-log) against batch size, one line per variant (naive, kit, …,
    bound). ``rows``: dicts with ``batch_bytes`` and ``gbps`` ({variant: GB/s})."""
    rows = [dict(r) for r in rows]
    if not rows:
        raise BadInputError("no rows to draw")
    sizes = [r["batch_bytes"] for r in rows]
    styles = {"bound": dict(color="0.3", linestyle="--"), "naive": dict(color="C1"),
              "kit": dict(color="C0", linewidth=2.2), "kit_no_prefetch": dict(color="C0",
                                                                               linestyle=":")}
    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(6.5, 3.6))
        ax = fig.add_subplot()
        for name in rows[0]["gbps"]:
            ax.plot(sizes, [r["gbps"][name] for r in rows], marker="o", label=name,
                    **styles.get(name, {}))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [format_bytes(s).replace(".00", "") for s in sizes], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("batch size (uint16 tokens)")
        ax.set_ylabel("GB/s")
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def allocator_settings(measurements: Iterable[AllocatorMeasurement | Mapping], *,
                       title: str = "What each allocator setting holds") -> Figure:
    """Per setting, three bars: what the driver says the process holds (nvidia-smi), the
    allocator's limit, and the bytes live arrays use; the GPU's total as a dashed line.
    ``measurements``: AllocatorMeasurement objects or their dicts."""
    rows = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in measurements]
    if not rows:
        raise BadInputError("no measurements to draw")
    bars = [("driver_used_bytes", "held (nvidia-smi)", "C3"),
            ("bytes_limit", "allocator limit", "0.6"),
            ("bytes_in_use", "in use by arrays", "C0")]
    total = max((r.get("total_bytes") or 0) for r in rows)
    peak = max([total, 1] + [r.get(k) or 0 for r in rows for k, _, _ in bars])
    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(7.0, 0.8 * len(rows) + 1.4))
        ax = fig.add_subplot()
        factor, unit = bytes_axis(ax.xaxis, peak)
        height = 0.8 / len(bars)
        for i, (key, label, color) in enumerate(bars):
            ys = [len(rows) - 1 - j + (1 - i) * height for j in range(len(rows))]
            ax.barh(ys, [(r.get(key) or 0) / factor for r in rows], height=height,
                    color=color, label=label)
        if total:
            ax.axvline(total / factor, color="0.2", linestyle="--", linewidth=1,
                       label=f"GPU total {format_bytes(total)}")
        ax.set_yticks(range(len(rows))[::-1], [r["setting"] + ("" if r.get("ok", True)
                                                               else " (failed)") for r in rows])
        ax.set_xlabel(unit)
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def pipeline_timeline(runs: Mapping[str, Sequence[tuple[str, float, float]]], *,
                      title: str = "Where the time goes") -> Figure:
    """One row per pipeline stage (gather, transfer, step) and one panel per run, each interval
    a bar. ``runs``: {label: [(stage, start, end), ...]} with perf_counter times."""
    runs = {k: list(v) for k, v in dict(runs).items()}
    if not runs or not any(runs.values()):
        raise BadInputError("no intervals to draw")
    stages = ["gather", "transfer", "step"]
    colors = {"gather": "C1", "transfer": "C0", "step": "C2"}
    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(7.5, 1.2 * len(runs) + 1.0))
        axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
        for ax, (label, intervals) in zip(axes, runs.items(), strict=True):
            t0 = min(s for _, s, _ in intervals) if intervals else 0.0
            for stage in stages:
                spans = [((s - t0) * 1e3, (e - s) * 1e3) for k, s, e in intervals if k == stage]
                ax.broken_barh(spans, (stages.index(stage) - 0.4, 0.8), color=colors[stage])
            ax.set_yticks(range(len(stages)), stages)
            ax.invert_yaxis()
            ax.set_title(label, loc="left", fontsize=10)
            ax.grid(axis="y", visible=False)
        axes[-1].set_xlabel("milliseconds")
        fig.suptitle(title, x=0.02, ha="left", fontweight="bold")
    return fig


def step_peaks(rows: Iterable[Mapping], *,
               title: str = "A step's peak: predicted and measured") -> Figure:
    """Grouped bars per step: XLA's own peak, the kit's prediction and the measured peak.
    ``rows``: dicts with ``label``, ``xla``, ``predicted`` and ``measured`` (bytes)."""
    rows = [dict(r) for r in rows]
    if not rows:
        raise BadInputError("no rows to draw")
    series = [("xla", "XLA's peak_memory_in_bytes", "0.65"),
              ("predicted", "kit: arguments + outputs - aliased + temporaries", "C0"),
              ("measured", "measured peak", "C2")]
    top = max(r[k] or 0 for r in rows for k, _, _ in series)
    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(7.5, 3.4))
        ax = fig.add_subplot()
        factor, unit = bytes_axis(ax.yaxis, top)
        ax.set_ylabel(unit)
        width = 0.8 / len(series)
        for i, (key, label, color) in enumerate(series):
            xs = [j + (i - 1) * width for j in range(len(rows))]
            ax.bar(xs, [(r[key] or 0) / factor for r in rows], width, label=label, color=color)
        ax.set_xticks(range(len(rows)), [r["label"] for r in rows], fontsize=8)
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=8)
    return fig
