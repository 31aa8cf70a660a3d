"""Text and HTML for the kit's records: preflight verdicts, OOM reproductions, memory
snapshots, transfer logs and token files.

Pure functions of the captured data, registered with :mod:`helpers._display` so that
``str(record)`` and Jupyter's views use them (the doctor report and placements are rendered by
:mod:`helpers.report`; figures by :mod:`helpers.plotting`).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from helpers import _display
from helpers.units import format_bytes as fb

if TYPE_CHECKING:  # records are registered by name below: rendering never imports JAX
    from helpers.datasets import TokenFile
    from helpers.oom import Reproduction
    from helpers.preflight import Preflight
    from helpers.snapshots import MemorySnapshot
    from helpers.transfers import TransferLog

__all__ = ["preflight_text", "reproduction_text", "snapshot_text", "token_file_text",
           "transfer_log_html", "transfer_log_text"]


def preflight_text(p: Preflight) -> str:
    lines = [f"{p.path} ({fb(p.file_bytes)})"]
    for t in p.tensors:
        lines.append(f"  {t.name}: {t.dtype}{list(t.shape)}  {fb(t.nbytes)}")
    lines.append(f"  total: {fb(p.total_bytes)} ({p.total_bytes:,} bytes)")
    lines.append(f"lands on: {p.device}  ({p.device_reason})")
    lines.append(f"free there: {fb(p.free_bytes)}  ({p.free_source})")
    lines.append(f"verdict: {p.verdict.upper()}")
    if p.advice:
        lines.append(f"  {p.advice}")
    return "\n".join(lines)


def reproduction_text(r: Reproduction) -> str:
    label = "STAND-IN (CPU, memory-capped child)" if r.stand_in else "real GPU"
    head = f"[{'fix' if r.fixed else 'seed load'}] {label}: {r.attempt}"
    if r.ok:
        body = (f"  OK: landed on {r.landed_on}; accelerator bytes added: "
                f"{fb(r.accelerator_bytes_added)}")
    else:
        body = f"  FAILED: {r.error_type}: {r.error_message}"
    return (f"{head}\n  wanted {fb(r.requested_bytes)} on {r.device}, "
            f"budget {fb(r.budget_bytes)} ({r.budget_how})\n{body}\n"
            f"  exit code {r.exit_code}, {r.elapsed_s:.2f} s")


def snapshot_text(s: MemorySnapshot) -> str:
    lines = [f"{'device':<10} {'in use':>12} {'peak':>12} {'limit':>12}  source"]
    for d in s.devices:
        lines.append(f"{d.device:<10} {fb(d.bytes_in_use):>12} {fb(d.peak_bytes):>12} "
                     f"{fb(d.limit_bytes):>12}  {d.source}")
    h = s.host
    lines.append(f"host RSS {fb(h.rss)} (anonymous {fb(h.anon)}, file-backed {fb(h.file)}); "
                 f"available {fb(h.available)} of {fb(h.total)}")
    return "\n".join(lines)


_KIND = {True: "explicit", False: "implicit", None: "?"}


def transfer_log_text(log: TransferLog) -> str:
    if not log.transfers:
        return "no transfers"
    lines = [f"{'direction':<15} {'kind':<9} {'count':>5} {'bytes':>12}"]
    for r in log.summary():
        if r["unknown_size"] == r["count"]:
            size = "?"  # logged without shapes (jit's fast path)
        else:
            size = fb(r["bytes"]) + ("+?" if r["unknown_size"] else "")
        lines.append(f"{r['direction']:<15} {_KIND[r['explicit']]:<9} {r['count']:>5} "
                     f"{size:>12}")
    return "\n".join(lines)


def transfer_log_html(log: TransferLog) -> str:
    if not log.transfers:
        return "<i>no transfers</i>"
    head = ("<table><tr><th>direction</th><th>kind</th><th>shape</th><th>dtype</th>"
            "<th>bytes</th><th>from</th><th>to</th></tr>")
    rows = []
    for t in log.transfers:
        shape = "?" if t.shape is None else str(list(t.shape))
        cells = (t.direction, _KIND[t.explicit], shape, t.dtype or "?",
                 fb(t.nbytes) if t.nbytes is not None else "?",
                 t.source or "?", t.destination or "?")
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
                    + "</tr>")
    return head + "".join(rows) + "</table>"


def token_file_text(t: TokenFile) -> str:
    return (f"{t.path}: {t.n_tokens:,} uint16 tokens, {fb(t.nbytes)} "
            f"of data ({fb(t.file_bytes)} on disk)")


_display.renders("helpers.preflight.Preflight", text=preflight_text)
_display.renders("helpers.oom.Reproduction", text=reproduction_text)
_display.renders("helpers.snapshots.MemorySnapshot", text=snapshot_text)
_display.renders("helpers.transfers.TransferLog", text=transfer_log_text, html=transfer_log_html)
_display.renders("helpers.datasets.TokenFile", text=token_file_text)
