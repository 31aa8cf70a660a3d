"""Figures of memory and transfers: a timeline from :func:`helpers.memory.track`, bars from a
snapshot, a transfer log's summary. Data in, ``matplotlib.figure.Figure`` out."""

from __future__ import annotations

import matplotlib.style
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from helpers._jax_internals import device_name
from helpers._plot_base import STYLE, _figure, _scaled, bytes_axis
from helpers.errors import BadInputError
from helpers.units import format_bytes

__all__ = ["memory_timeline", "snapshot_bars", "transfer_summary"]


def memory_timeline(trace, *, title: str = "Memory over time", devices=None,
                    host: bool = True, labels=None) -> Figure:
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
        fig = _figure()
        ax = fig.add_subplot()
        factor, unit = bytes_axis(ax.yaxis, peak)
        for name in names:
            src = data["sources"].get(name, "")
            line, = ax.step(times, _scaled(series[name], factor), where="post",
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


def snapshot_bars(snap, *, title: str = "Memory now") -> Figure:
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
        fig = _figure(figsize=(7.5, 0.45 * len(labels) + 1.2))
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


def transfer_summary(log, *, title: str = "Transfers") -> Figure:
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
        fig = _figure(figsize=(7.5, 2.8))
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
