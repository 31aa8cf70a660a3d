"""Render device reports and placements: text (terminal) and HTML (notebooks).

Pure functions of the captured data, registered with :mod:`helpers._display` so that
``str(report)`` and Jupyter's views use them. The JSON form lives beside the data
(``DeviceReport.to_dict``). HTML is deterministic: no random ids, no scripts, no
timestamps, so a notebook re-run produces the same markup on the same machine.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from helpers import _display
from helpers.unavailable import NOT_AVAILABLE
from helpers.units import format_bytes

if TYPE_CHECKING:  # records are registered by name below
    from helpers.device_report import DeviceReport
    from helpers.placement import Placement

__all__ = [
    "placement_html",
    "placement_text",
    "report_html",
    "report_text",
]

_STAT_KEYS = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "bytes_reserved")


# --- text ---------------------------------------------------------------------------------
def _stats_text(stats) -> str:
    if stats is NOT_AVAILABLE:
        return "memory stats: not available on this backend"
    parts = [f"{k}={format_bytes(stats[k])}" for k in _STAT_KEYS if k in stats]
    return "memory stats: " + (", ".join(parts) or f"{len(stats)} counters")


def report_text(r: DeviceReport) -> str:
    lines = ["JAX Device Kit - doctor", ""]
    v = r.versions
    lines.append(
        f"python {v.get('python')} | jax {v.get('jax')} | jaxlib {v.get('jaxlib')} | "
        f"numpy {v.get('numpy')} | safetensors {v.get('safetensors')}"
    )
    lines.append("plugins: " + (", ".join(f"{k} {x}" for k, x in r.plugins.items()) or "none"))
    lines.append("")
    lines.append(f"default backend: {r.default_backend or 'NONE (no backend started)'}")
    lines.append(f"default device:  {r.default_device or 'NONE'}  ({r.default_device_source})")
    if r.platforms_requested:
        lines.append(f"JAX_PLATFORMS:   {r.platforms_requested}")
    lines.append("")
    lines.append("Backends")
    if not r.backends:
        lines.append("  (none started)")
    for b in r.backends:
        mark = "  [default]" if b.is_default else ""
        lines.append(f"  {b.name}{mark}: {len(b.devices)} device(s)  {b.platform_version}".rstrip())
        for d in b.devices:
            kinds = ", ".join(d.memory_kinds) or "-"
            lines.append(f"    {d.name or d.id}  {d.kind}  process {d.process_index}  "
                         f"memories: {kinds}")
            lines.append(f"      {_stats_text(d.memory_stats)}")
    if r.failed_backends:
        lines.append("")
        lines.append("Backends that did not start")
        for f in r.failed_backends:
            lines.append(f"  {f.name}: {f.error}")
            if f.hint:
                lines.append(f"    -> {f.hint}")
    lines.append("")
    lines.append("Environment (placement and allocation)")
    width = max(len(e.name) for e in r.environment) if r.environment else 0
    for e in r.environment:
        value = "(unset)" if e.value is None else repr(e.value)
        lines.append(f"  {e.name:<{width}}  {value}")
    lines.append("")
    if r.warnings:
        lines.append(f"Warnings ({len(r.warnings)})")
        for w in r.warnings:
            lines.append(f"  ! [{w.code}] {w.message}")
            lines.append(f"    fix: {w.fix}")
    else:
        lines.append("Warnings: none")
    return "\n".join(lines)


# --- HTML ---------------------------------------------------------------------------------
_CSS = (
    "<style>.jdk-report{font-family:var(--jp-ui-font-family,sans-serif);font-size:13px}"
    ".jdk-report table{border-collapse:collapse;margin:4px 0 10px}"
    ".jdk-report th,.jdk-report td{border:1px solid #ccc;padding:2px 8px;text-align:left}"
    ".jdk-report .warn{color:#a40}.jdk-report .fail{color:#b00}</style>"
)


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def report_html(r: DeviceReport) -> str:
    out = [_CSS, '<div class="jdk-report">']
    out.append(
        f"<b>default backend</b> {_e(r.default_backend or 'none')} &middot; "
        f"<b>default device</b> {_e(r.default_device or 'none')} "
        f"<i>({_e(r.default_device_source)})</i>"
    )
    out.append("<table><tr><th>backend</th><th>device</th><th>kind</th><th>process</th>"
               "<th>memory kinds</th><th>bytes in use</th><th>bytes limit</th></tr>")
    for b in r.backends:
        for d in b.devices:
            stats = d.memory_stats
            used = format_bytes(stats.get("bytes_in_use")) if stats else "not available"
            limit = format_bytes(stats.get("bytes_limit")) if stats else "not available"
            name = _e(b.name) + (" (default)" if b.is_default else "")
            out.append(
                f"<tr><td>{name}</td><td>{_e(d.name or d.id)}</td><td>{_e(d.kind)}</td>"
                f"<td>{d.process_index}</td><td>{_e(', '.join(d.memory_kinds))}</td>"
                f"<td>{_e(used)}</td><td>{_e(limit)}</td></tr>"
            )
    out.append("</table>")
    if r.failed_backends:
        out.append("<b>Backends that did not start</b><ul>")
        for f in r.failed_backends:
            hint = f" &rarr; {_e(f.hint)}" if f.hint else ""
            out.append(f'<li class="fail"><code>{_e(f.name)}</code>: {_e(f.error)}{hint}</li>')
        out.append("</ul>")
    set_vars = [e for e in r.environment if e.value is not None]
    out.append("<b>Environment</b> ")
    if set_vars:
        out.append("<table>" + "".join(
            f"<tr><td><code>{_e(e.name)}</code></td><td><code>{_e(e.value)}</code></td>"
            f"<td>{_e(e.meaning)}</td></tr>" for e in set_vars) + "</table>")
    else:
        out.append("<i>none of the placement/allocation variables is set</i><br>")
    if r.warnings:
        out.append("<b>Warnings</b><ul>")
        for w in r.warnings:
            out.append(f'<li class="warn">[{_e(w.code)}] {_e(w.message)} '
                       f"<b>Fix:</b> {_e(w.fix)}</li>")
        out.append("</ul>")
    v = r.versions
    out.append(
        f"<small>jax {_e(v.get('jax'))}, jaxlib {_e(v.get('jaxlib'))}, "
        f"numpy {_e(v.get('numpy'))}, safetensors {_e(v.get('safetensors'))}, "
        f"python {_e(v.get('python'))}; plugins: "
        f"{_e(', '.join(f'{k} {x}' for k, x in r.plugins.items()) or 'none')}</small>"
    )
    out.append("</div>")
    return "".join(out)


# --- placement ----------------------------------------------------------------------------
def _several(p: Placement) -> bool:
    """Worth the sharding and shard lines: several devices, or a sharding that is not the
    plain one-device kind."""
    return len(p.shards) > 1 or p.sharding not in ("", "SingleDeviceSharding")


def _shards_summary(p: Placement) -> str:
    times = p.device_bytes / p.nbytes if p.nbytes else 0
    kind = "replicated" if p.replicated else "sharded"
    return (f"{len(p.shards)} ({kind}), {format_bytes(p.device_bytes)} on devices in all "
            f"({times:g} x the array)")


def placement_text(p: Placement) -> str:
    where = ", ".join(p.devices) if p.devices else "host memory"
    committed = {True: "committed", False: "uncommitted", None: "n/a (NumPy)"}[p.committed]
    lines = [f"{p.kind} {p.dtype}{list(p.shape)} ({format_bytes(p.nbytes)})"]
    if _several(p):
        lines.append(f"  sharding:    {p.sharding}")
    lines += [f"  devices:     {where}", f"  memory kind: {p.memory_kind}",
              f"  committed:   {committed}"]
    if _several(p):
        lines.append(f"  shards:      {_shards_summary(p)}")
        w = max(len(s.device) for s in p.shards)
        wi = max(len(s.index) for s in p.shards)
        lines += [f"    {s.device:<{w}}  {s.index:<{wi}}  {str(s.shape):<12} "
                  f"{format_bytes(s.nbytes)}" for s in p.shards]
    lines.append(f"  meaning:     {p.explanation}")
    return "\n".join(lines)


def placement_html(p: Placement) -> str:
    where = ", ".join(p.devices) if p.devices else "host memory"
    committed = {True: "committed", False: "uncommitted", None: "n/a (NumPy)"}[p.committed]
    rows = [("devices", where), ("memory kind", p.memory_kind), ("committed", committed),
            ("bytes", f"{format_bytes(p.nbytes)} ({p.nbytes:,})")]
    shards = ""
    if _several(p):
        rows = [("sharding", p.sharding), *rows, ("shards", _shards_summary(p))]
        shards = ("<table><tr><th>device</th><th>index</th><th>shape</th><th>bytes</th></tr>"
                  + "".join(f"<tr><td>{_e(s.device)}</td><td><code>{_e(s.index)}</code></td>"
                            f"<td>{_e(s.shape)}</td><td>{_e(format_bytes(s.nbytes))}</td></tr>"
                            for s in p.shards) + "</table>")
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return (f'{_CSS}<div class="jdk-report"><b>{_e(p.kind)}</b> '
            f"<code>{_e(p.dtype)}{_e(list(p.shape))}</code><table>{body}</table>{shards}"
            f"{_e(p.explanation)}</div>")


_display.renders("helpers.device_report.DeviceReport", text=report_text, html=report_html)
_display.renders("helpers.placement.Placement", text=placement_text, html=placement_html)
