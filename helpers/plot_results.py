"""Figures of measured results: requests against a budget, load strategies, feeding rates,
allocator settings, and the feeding pipeline's timeline. Data in, ``Figure`` out."""

from __future__ import annotations

import matplotlib.style
from matplotlib.figure import Figure

from helpers._plot_base import STYLE, _figure, bytes_axis
from helpers.errors import BadInputError
from helpers.units import format_bytes

__all__ = ["allocator_settings", "feeding", "load_strategies", "pipeline_timeline",
           "request_vs_budget", "step_peaks"]


def request_vs_budget(rows, *, title: str = "Requested bytes against the budget") -> Figure:
    """One panel per case, each on its own binary-unit scale: the bytes a load requested
    against the memory budget it had (and the device's whole memory, where given).

    rows: iterable of dicts with ``label``, ``requested``, ``budget`` and optionally ``total``.
    """
    rows = list(rows)
    if not rows:
        raise BadInputError("no rows to draw")
    with matplotlib.style.context(STYLE):
        fig = _figure(figsize=(7.5, 1.35 * len(rows) + 0.6))
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


def load_strategies(measurements, *, title: str = "Loading the token file four ways") -> Figure:
    """Two panels per strategy: wall time, and peak memory above the baseline split into
    anonymous and file-backed RSS, with accelerator bytes written beside each bar.
    ``measurements``: LoadMeasurement objects or their dicts (medians, one per strategy)."""
    rows = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in measurements]
    if not rows:
        raise BadInputError("no measurements to draw")
    names = [r["strategy"] for r in rows]
    with matplotlib.style.context(STYLE):
        fig = _figure(figsize=(7.5, 0.55 * len(rows) + 1.6))
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


def feeding(rows, *, title: str = "Feeding the accelerator") -> Figure:
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
        fig = _figure(figsize=(6.5, 3.6))
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


def allocator_settings(measurements, *, title: str = "What each allocator setting holds") -> Figure:
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
        fig = _figure(figsize=(7.0, 0.8 * len(rows) + 1.4))
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


def pipeline_timeline(runs, *, title: str = "Where the time goes") -> Figure:
    """One row per pipeline stage (gather, transfer, step) and one panel per run, each interval
    a bar. ``runs``: {label: [(stage, start, end), ...]} with perf_counter times."""
    runs = {k: list(v) for k, v in dict(runs).items()}
    if not runs or not any(runs.values()):
        raise BadInputError("no intervals to draw")
    stages = ["gather", "transfer", "step"]
    colors = {"gather": "C1", "transfer": "C0", "step": "C2"}
    with matplotlib.style.context(STYLE):
        fig = _figure(figsize=(7.5, 1.2 * len(runs) + 1.0))
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


def step_peaks(rows, *, title: str = "A step's peak: predicted and measured") -> Figure:
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
        fig = _figure(figsize=(7.5, 3.4))
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
