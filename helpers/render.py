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
    from helpers.step_measure import StepMeasurement
    from helpers.step_preflight import StepPreflight
    from helpers.transfers import TransferLog

__all__ = ["preflight_text", "reproduction_text", "snapshot_text", "step_measurement_text",
           "step_preflight_html", "step_preflight_text", "token_file_text", "transfer_log_html",
           "transfer_log_text"]


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


def _step_rows(p: StepPreflight) -> list[tuple[str, str]]:
    donated = f" (donated: {', '.join(map(str, p.donated))})" if p.donated else ""
    return [
        ("arguments", fb(p.argument_bytes) + donated),
        ("outputs", fb(p.output_bytes)),
        ("aliased (outputs written into donated arguments)", fb(p.alias_bytes)),
        ("temporaries", fb(p.temp_bytes)),
        ("generated code", fb(p.code_bytes)),
        ("peak: arguments + outputs - aliased + temporaries", fb(p.peak_bytes)),
        ("XLA's own peak_memory_in_bytes", fb(p.xla_peak_bytes)),
        ("arguments already there", fb(p.resident_bytes)),
        ("the step adds", fb(p.needed_bytes)),
        ("in use there now", f"{fb(p.in_use_bytes)}  ({p.in_use_source})"),
        ("free there", f"{fb(p.free_bytes)}  ({p.free_source})"),
    ]


def step_preflight_text(p: StepPreflight) -> str:
    lines = [f"{p.function} on {p.device}  ({p.device_reason})"]
    lines += [f"  {k + ':':<50} {v}" for k, v in _step_rows(p)]
    lines.append(f"verdict: {p.verdict.upper()}")
    if p.advice:
        lines.append(f"  {p.advice}")
    return "\n".join(lines)


def step_preflight_html(p: StepPreflight) -> str:
    colour = {"fits": "#1a7f37", "will not fit": "#cf222e"}.get(p.verdict, "#9a6700")
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                   for k, v in _step_rows(p))
    advice = f"<br>{html.escape(p.advice)}" if p.advice else ""
    return (f"<b>{html.escape(p.function)}</b> on <code>{html.escape(p.device)}</code> "
            f"({html.escape(p.device_reason)})<table>{rows}</table>"
            f"<b style='color:{colour}'>verdict: {html.escape(p.verdict.upper())}</b>{advice}")


def step_measurement_text(m: StepMeasurement) -> str:
    peak = fb(m.peak_bytes) if m.peak_bytes else "not measurable"
    note = f"\n  {m.note}" if m.note else ""
    return (f"{m.function} on {m.device}: measured peak {peak} ({m.source}); arguments "
            f"{fb(m.argument_bytes)}; ran {m.seconds:.3f} s{note}")


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
_display.renders("helpers.step_measure.StepMeasurement", text=step_measurement_text)
_display.renders("helpers.step_preflight.StepPreflight", text=step_preflight_text,
                 html=step_preflight_html)
_display.renders("helpers.snapshots.MemorySnapshot", text=snapshot_text)
_display.renders("helpers.transfers.TransferLog", text=transfer_log_text, html=transfer_log_html)
_display.renders("helpers.datasets.TokenFile", text=token_file_text)
