"""Text (terminal) and HTML (notebooks) for every record the kit returns: the doctor's report,
placements, preflight verdicts, OOM reproductions, memory snapshots, transfer logs, token files
and load measurements.

Pure functions of the captured data, registered with :func:`helpers._internal.records.renders`
by the record's name, so ``str(record)`` and Jupyter's views use them and capture modules never
import this one (nor JAX through it). The JSON form is the record's own ``to_dict``. HTML is
deterministic: no random ids, no scripts, no timestamps, so a notebook re-run produces the same
markup on the same machine. Figures: :mod:`helpers.plotting`.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from helpers._internal import records
from helpers.units import NOT_AVAILABLE, format_bytes

if TYPE_CHECKING:  # records are registered by name below: rendering never imports JAX
    from helpers.compiles import CompileLog
    from helpers.datasets import TokenFile
    from helpers.devices import DeviceReport, Placement, ProcessView, TreePlacement
    from helpers.holders import Holders
    from helpers.ipython import CellMemory
    from helpers.measure import StepMeasurement
    from helpers.memory import MemorySnapshot, MemoryTrace
    from helpers.oom import CappedCell, LibraryFailure, OomReport, Reproduction
    from helpers.preflight import Preflight, Residuals, StepPreflight
    from helpers.processes import Job, ProcessReport
    from helpers.settings import ProcessCheck
    from helpers.transfers import TransferLog

__all__ = ["capped_cell_text", "cell_memory_text", "compile_log_text", "holders_text",
           "library_failure_text", "load_table", "oom_report_text", "placement_html",
           "placement_text", "preflight_text", "process_check_text", "report_html", "report_text",
           "reproduction_text", "residuals_text", "snapshot_text", "step_measurement_text",
           "step_preflight_html", "step_preflight_text", "token_file_text", "transfer_log_html",
           "transfer_log_text", "tree_placement_html", "tree_placement_text"]

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
    if r.processes is not None and (r.processes.distributed or r.processes.process_count > 1
                                    or r.processes.note):
        lines.append(f"processes:       {_process_line(r.processes)}")
        if r.processes.note:
            lines.append(f"  ! {r.processes.note}")
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


def _process_line(v: ProcessView) -> str:
    where = f", coordinator {v.coordinator}" if v.coordinator else ""
    return (f"this is process {v.process_index} of {v.process_count}{where}; "
            f"{len(v.local_devices)} of {len(v.devices)} devices are its own "
            f"({', '.join(v.local_devices)})")


def process_view_text(v: ProcessView) -> str:
    lines = [f"process {v.process_index} of {v.process_count}"
             + ("" if v.distributed else " (jax.distributed not initialized)"),
             f"  coordinator:   {v.coordinator or 'none'}",
             f"  local devices: {', '.join(v.local_devices)}",
             f"  all devices:   {', '.join(v.devices)}"]
    if v.other_devices:
        lines.append(f"  not its own:   {', '.join(v.other_devices)} (other processes: their "
                     "memory is out of this process's reach)")
    if v.launch_environment:
        lines.append("  launched with: " + ", ".join(f"{k}={x}" for k, x in
                                                     v.launch_environment.items()))
    if v.note:
        lines.append(f"  ! {v.note}")
    return "\n".join(lines)


def job_text(j: Job) -> str:
    head = (f"{j.target}: {j.processes} processes x {j.devices_per_process} devices, "
            f"coordinator {j.coordinator}, {j.seconds:.1f} s\n  ({j.stand_in})")
    def short(failure: str) -> str:  # how it ended, and the last line it printed
        lines = failure.strip().splitlines()
        head = lines[0].split("; its stderr ends with:")[0].replace("the child process ", "")
        return head + (f": {lines[-1].strip()}" if len(lines) > 1 else "")

    rows = [f"  process {i}: " + (f"FAILED, {short(f)}" if f else "answered")
            for i, f in enumerate(j.failures)]
    return "\n".join([head, *rows])


def process_report_text(r: ProcessReport) -> str:
    v = r.view
    lines = [f"process {v.process_index} of {v.process_count}: own devices "
             f"{', '.join(v.local_devices)}; all devices {', '.join(v.devices)}",
             f"  global array {r.placement.dtype}{list(r.placement.shape)}: holds "
             f"{sum(s.addressable for s in r.placement.shards)} of {len(r.placement.shards)} "
             f"shards ({format_bytes(r.placement.local_bytes)}); sum over every process "
             f"{r.global_sum:g}",
             f"  np.asarray here: {r.read_error or 'read'}",
             "  memory on its devices: " + ", ".join(f"{d} {format_bytes(b)}"
                                                    for d, b in r.device_bytes.items())]
    if r.whole_file_bytes:
        lines.append(f"  feeding: rows {r.batch_rows[0]}-{r.batch_rows[1]} of each batch, "
                     f"{format_bytes(r.batch_bytes_here)} gathered here per batch; the whole "
                     f"file loaded: {format_bytes(r.anon_growth_whole_file)} of its own memory")
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
    if r.processes is not None and (r.processes.distributed or r.processes.process_count > 1
                                    or r.processes.note):
        note = f' <span class="warn">{_e(r.processes.note)}</span>' if r.processes.note else ""
        out.append(f"<br><b>processes</b> {_e(_process_line(r.processes))}{note}")
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
    others = sum(not s.addressable for s in p.shards)
    elsewhere = (f"; {others} in other processes, {format_bytes(p.local_bytes)} in this one"
                 if others else "")
    return (f"{len(p.shards)} ({kind}), {format_bytes(p.device_bytes)} on devices in all "
            f"({times:g} x the array){elsewhere}")


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
                  f"{format_bytes(s.nbytes)}"
                  + ("" if s.addressable else f"  (process {s.process_index}: not this one's)")
                  for s in p.shards]
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
                  + "".join(f"<tr><td>{_e(s.device)}"
                            + ("" if s.addressable else
                               f" <i>(process {s.process_index}: not this one's)</i>")
                            + f"</td><td><code>{_e(s.index)}</code></td>"
                            f"<td>{_e(s.shape)}</td><td>{_e(format_bytes(s.nbytes))}</td></tr>"
                            for s in p.shards) + "</table>")
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return (f'{_CSS}<div class="jdk-report"><b>{_e(p.kind)}</b> '
            f"<code>{_e(p.dtype)}{_e(list(p.shape))}</code><table>{body}</table>{shards}"
            f"{_e(p.explanation)}</div>")


def _leaf_row(leaf) -> tuple[str, ...]:
    committed = {True: "committed", False: "uncommitted", None: ""}[leaf.committed]
    where = "deleted" if leaf.deleted else (", ".join(leaf.devices) or (
        "host (NumPy)" if leaf.kind == "numpy.ndarray" else
        "another framework" if leaf.foreign else "Python value"))
    kind = "" if leaf.memory_kind in (None, "device") else leaf.memory_kind
    array = f"{leaf.dtype}{list(leaf.shape)}" if leaf.dtype else leaf.kind
    return (leaf.path, array, where, kind, committed,
            format_bytes(leaf.nbytes))


_LEAF_HEAD = ("leaf", "array", "where", "memory kind", "committed", "bytes")


def tree_placement_text(t: TreePlacement) -> str:
    rows = [_LEAF_HEAD, *map(_leaf_row, t.leaves)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_LEAF_HEAD))]
    lines = ["  ".join(c.ljust(w) if i < 5 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]
    lines.append("bytes by place: " + ", ".join(f"{k} {format_bytes(v)}"
                                                 for k, v in t.bytes_by_place.items()))
    lines += [f"! {problem}" for problem in t.problems] or ["no problem for a jit over it"]
    return "\n".join(lines)


def tree_placement_html(t: TreePlacement) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in _LEAF_HEAD)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in _leaf_row(leaf)) + "</tr>"
                   for leaf in t.leaves)
    places = ", ".join(f"{_e(k)} {_e(format_bytes(v))}" for k, v in t.bytes_by_place.items())
    problems = "".join(f"<li>{_e(x)}</li>" for x in t.problems)
    verdict = f"<ul>{problems}</ul>" if problems else "<p>no problem for a jit over it</p>"
    return (f'{_CSS}<div class="jdk-report"><table><tr>{head}</tr>{body}</table>'
            f"<p>bytes by place: {places}</p>{verdict}</div>")


def holders_text(h: Holders) -> str:
    views = (f" ({h.shard_views} of them JAX's views of a sharded array's shards, made when "
             "it was read on the host or shard by shard: no memory of their own, freed with it)"
             if h.shard_views else "")
    lines = [f"{h.live_arrays} live arrays{views}, {format_bytes(h.live_bytes)}; the largest "
             f"{len(h.arrays)}: {format_bytes(h.user_bytes)} held by your code, "
             f"{format_bytes(h.jax_bytes)} by JAX alone" + (
                 f", {format_bytes(h.history_bytes)} by IPython alone (its output history, "
                 "or its record of the last cell run: each array's line below says how to let "
                 "it go)" if h.history_bytes else "") + (
                 f", {format_bytes(h.library_bytes)} by a library's module-level state"
                 if h.library_bytes else "") + (
                 f"; {format_bytes(h.cycle_bytes)} of all live arrays held only by reference "
                 "cycles (Python frees them at its next cycle collection, gc.collect())"
                 if h.cycle_bytes else "")]
    for a in h.arrays:
        lines.append(f"  {format_bytes(a.nbytes):>10}  {a.array}")
        lines += [f"              held by {who}" for who in a.held_by] or [
            "              held by JAX alone"]
        if a.host_copy:
            lines.append(f"              and keeps a {format_bytes(a.host_copy)} host copy a "
                         "read on the host made (np.asarray, jax.device_get), as long as it "
                         "lives")
        if a.fix:
            lines.append(f"              -> {a.fix}")
    if h.cpu_executables and h.cpu_executables == h.executables:
        code = "generated code not reported by the CPU backend: XLA gives 0"
    else:
        code = f"generated code {format_bytes(h.executable_code_bytes)}" + (
            f"; the CPU backend's {h.cpu_executables} not reported" if h.cpu_executables
            else "")
    lines.append(f"compiled programs loaded: {h.executables} ({code})")
    if h.many_programs:
        lines.append(f"! {h.many_programs}")
    for name, programs, nbytes in h.program_constants:
        each = (f"{programs} programs named {name} hold {format_bytes(nbytes)} of constants"
                if programs > 1 else f"the program {name} holds {format_bytes(nbytes)} of "
                "constants")
        lines.append(
            f"{each}, kept for as long as JAX keeps the programs: arrays baked into the "
            "program (one the function closes over, or makes with NumPy), a copy per compile, "
            "so each new static value or shape adds one (jax-ml/jax#10878). Pass the array as "
            "an argument; f.clear_cache() or jax.clear_caches() drops the programs.")
    if h.many_small:
        lines.append(h.many_small)
    if h.restarted:
        lines.append(h.restarted)
    if h.host_copies:
        lines.append(h.host_copies)
    lines += [_alike_text(names, nbytes) for names, nbytes in h.alike]
    if not h.complete:
        lines.append(f"(stopped after {h.seconds:.1f} s: the time budget ran out)")
    return "\n".join(lines)


def _alike_text(names: tuple[str, ...], nbytes: int) -> str:
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    return (f"{listed} hold trees alike (the same keys, shapes and dtypes, {format_bytes(nbytes)} "
            f"each, {format_bytes(nbytes * len(names))} together, in different buffers). If one "
            "is a leftover copy (a random init made before loading pretrained weights, the "
            "parameters before training, a state initialized and then restored from a "
            "checkpoint), `del` it, or never make it: a Hugging Face Flax model's "
            "from_pretrained(..., _do_init=False); a state released before the restore "
            "(marin-community/marin#8480), or restored into jax.eval_shape(init, ...)'s shapes. "
            "Trees alike on purpose (gradients, an EMA) are fine.")


def compile_log_text(log: CompileLog) -> str:
    if not log.finished:
        return "compiles: the block has not ended yet"
    tracing = (f", {log.trace_seconds:.2f} s of JAX tracing and {log.lowering_seconds:.2f} s "
               "of lowering" if log.trace_seconds or log.lowering_seconds else "")
    lines = [f"{log.compiles} compile(s), {log.compile_seconds:.2f} s of XLA compiling{tracing}, "
             f"in a block of {log.seconds:.2f} s" + (
                 f" ({log.cache_loads} of them loaded from the persistent compilation cache, "
                 f"{log.load_seconds:.2f} s)" if log.cache_loads else "") + (
                 f" ({log.kit_compiles} more the kit made itself to price a step, such as "
                 "preflight_step, or to compare a tree's slices, such as tree_placement, left "
                 "out)" if log.kit_compiles else "")]
    for f in log.functions:
        where = f" ({f.place})" if f.place else ""
        if f.function in ("eager operations", "compiles JAX did not explain"):
            # a group, named by its cause: what it says is whether a name in it compiled again
            again = (f"up to {f.most_of_one} compiles of one name" if f.most_of_one > 1 else
                     "each name once in this block" + (
                         "" if f.function == "eager operations" else
                         ", as a first compile (JAX explains no compile of a trace it had "
                         "made already: one traced before the block, by jax.jit(f).lower "
                         "or the kit's preflight_step, say)"))
            lines.append(f"  {f.compiles:>4} x  {f.function}: {again}")
            lines += [f"           {c}" for c in f.changed[:3]]
            continue
        if not f.compiles:  # traced inside another function's compile: a body, an inner jit
            cause = "" if f.cause == "first compile" else f"{f.cause_in_words}, "
            lines.append(f"     - traced {f.traces} time{'s' if f.traces != 1 else ''}: "
                         f"{f.function}{where}, {cause}inside another function's compile (a "
                         "loop's body, a branch, an inner jit), none of its own")
            lines += [f"           {c}" for c in f.changed[:3]]
            continue
        traced = f", traced {f.traces} times" if f.traces != f.compiles else ""
        ahead = (f", {'all' if f.ahead_of_time == f.compiles else f.ahead_of_time} asked for "
                 "ahead of time (.lower(...).compile(): a warm-up, one program per shape, no "
                 "recompile)" if f.ahead_of_time and f.cause == "new shapes" else "")
        lines.append(f"  {f.compiles:>4} x  {f.function}{where}: {f.cause_in_words}{traced}"
                     f"{ahead}")
        lines += [f"           {c}" for c in f.changed[:3]]
    lines += ["", log.diagnosis]
    return "\n".join(lines)


def process_check_text(c: ProcessCheck) -> str:
    if not c.platforms:
        lines = ["JAX has not started a backend in this process: only the environment is checked"]
    else:
        lines = ["this process: " + ", ".join(f"{p} ({c.devices[p]} device"
                                               f"{'s' if c.devices[p] != 1 else ''})"
                                               for p in c.platforms)]
        for platform, values in c.started_with.items():
            set_ = {k: v for k, v in values.items() if v is not None}
            lines.append(f"  {platform} started with: "
                         + (", ".join(f"{k}={v}" for k, v in set_.items()) or "none of the "
                            "variables set"))
        if not c.started_with:
            lines.append(f"  what the backends started with: unknown (hook {c.hook})")
        if c.started_at:
            lines.append(f"  started by: {c.started_at}"
                         + (" (while a module was being imported)" if c.started_importing else ""))
    lines += [f"! [{w.code}] {w.message}\n    fix: {w.fix}" for w in c.warnings] or [
        "no known mistake"]
    return "\n".join(lines)


def oom_report_text(r: OomReport) -> str:
    lines = [f"Out of memory on {r.device}: {r.error}"]
    if r.stand_in:
        lines.append(f"  asked for {format_bytes(r.requested_bytes)}; the CPU stand-in's cap "
                     f"(RLIMIT_AS) leaves room for {format_bytes(r.limit_bytes)}, of which live "
                     f"arrays use {format_bytes(r.in_use_bytes)} (the CPU has no allocator "
                     "pool)")
    else:
        lines.append(f"  asked for {format_bytes(r.requested_bytes)}; pool limit "
                     f"{format_bytes(r.limit_bytes)}, in use {format_bytes(r.in_use_bytes)}, "
                     f"largest free block {format_bytes(r.largest_free_block_bytes)}")
    if r.program:  # on a GPU the error can come at a later wait, far from the line that asked
        lines.append(f"  asked by the compiled program {r.program!r}. The traceback's line may be "
                     "a later one: on an H100 (jax 0.11.2) an eager op that got no memory raised "
                     "nothing at its line, and waiting for its result raised")
    if r.other_processes_bytes:
        lines.append(f"  other processes on the card: {format_bytes(r.other_processes_bytes)}")
    lines.append("Who holds memory:")
    lines += ["  " + line for line in holders_text(r.held).splitlines()]
    if r.made_at:
        lines.append("Where the largest buffers were made (device memory profile):")
        lines += [f"  {m}" for m in r.made_at]
    return "\n".join(lines + _ranked(r.fixes))


def _ranked(fixes: tuple[str, ...]) -> list[str]:
    """The fixes of an explanation, numbered, most likely first."""
    return ["What to change, most likely first:",
            *(f"  {i}. {f}" for i, f in enumerate(fixes, 1))]


def library_failure_text(r: LibraryFailure) -> str:
    lines = [f"{r.library} could not start{' on ' + r.device if r.device else ''}: {r.error}",
             (f"  the card: {format_bytes(r.free_bytes)} free of {format_bytes(r.total_bytes)} "
              f"(when asked, after the failure); JAX's pool {format_bytes(r.pool_bytes)}; other "
              f"processes {format_bytes(r.other_processes_bytes)}" if r.total_bytes else
              "  the card's memory: not read (no NVIDIA driver answered here)")]
    lines += [f"  beside JAX in this process: {what}" for what, _ in r.beside]
    if r.loaded:
        lines.append("CUDA libraries this process loaded, and from where:")
        lines += [f"  {line}" for line in r.loaded]
    return "\n".join(lines + _ranked(r.fixes))


def _arrays(n: int) -> str:
    return f"{n} array was" if n == 1 else f"{n} arrays were"


#: a device row counted from live arrays (helpers.memory.LIVE_ARRAYS: no capture module here)
_LIVE_ARRAYS = "live arrays"


def _few(devices: list[str]) -> str:
    """Up to four device names, then "…"."""
    return ", ".join(devices[:4]) + (" …" if len(devices) > 4 else "")


def cell_memory_text(c: CellMemory) -> str:
    lines = [f"{'device':<10} {'before':>14} {'after':>14} {'peak':>14}  source"]
    for d in c.devices:
        lines.append(f"{d.device:<10} {format_bytes(d.before):>14} {format_bytes(d.after):>14} "
                     f"{format_bytes(d.peak):>14}  {d.source}")
    lines.append(f"{'host RSS':<10} {format_bytes(c.host_before):>14} "
                 f"{format_bytes(c.host_after):>14} {format_bytes(c.host_peak):>14}  "
                 "high-water mark")
    missed = ("an array made and dropped between two samples is missed (old values freed when "
              "a name is rebound in the same line, as in params = jax.tree.map(lambda p: "
              "p.astype(...), params))")
    if live := [d.device for d in c.devices if d.source == _LIVE_ARRAYS]:
        rose = (f" (here {format_bytes(c.host_peak - c.host_before)} above the cell's start)"
                if isinstance(c.host_peak, int) and c.host_peak > c.host_before else "")
        lines.append(f"The row{'s' if len(live) > 1 else ''} of {_few(live)} count"
                     f"{'s' if len(live) == 1 else ''} live arrays only: "
                     "XLA's temporaries inside a call are not live arrays and never appear "
                     "there, however often it is sampled (jax-ml/jax#8096: a sort's 64 MiB "
                     "temporary, 981 samples, the row did not rise). On the CPU the host RSS "
                     f"high-water mark is this cell's peak{rose}: its device buffers and "
                     "temporaries are host memory. The peak on "
                     f"{_few(live)} is sampled every {c.sample_seconds * 1000:g} ms: {missed}.")
    if sampled := [d.device for d in c.devices if not d.peak_exact
                   and d.source != _LIVE_ARRAYS]:
        lines.append(f"The peak on {_few(sampled)} is sampled every {c.sample_seconds * 1000:g} "
                     f"ms: {missed}. Where a GPU allocator's own high-water mark rose during the "
                     "cell, its peak is exact.")
    moved = ", ".join(f"{r['count']} {r['direction']} "
                      f"({'explicit' if r['explicit'] else 'implicit'}"
                      + (", " + _spelled(_copied_size(r))
                         if r["bytes"] or r["unknown_size"] else "") + ")"
                      for r in c.transfers) or "none seen"
    lines.append(f"copies: {moved}; {c.seconds:.2f} s with the kit watching (its line tracer "
                 "slows Python code: time the cell without %%memory)"
                 + (" (the cell raised)" if c.failed else ""))
    lines += [f"  {n:,} of them: {why}" for _, n, why in c.callback_copies]
    lines.append(f"compiles: {c.compiles}" + (" (each function once)"
                                              if c.compiles and not c.recompiled else ""))
    lines += c.recompiled
    for function, where, seconds in c.first_compiles if c.first_call_timed else ():
        lines.append(f"  the first call of {function}{f' ({where})' if where else ''} compiled "
                     f"it: {seconds:.2f} s of tracing, lowering and compiling in that call "
                     "alone, so it is slower than the later calls, which reuse the program for "
                     "the same shapes and dtypes (Physical-Intelligence/openpi#271): time the "
                     "calls after the first.")
    for function, where, seconds, cause in c.compiled_again_timed:
        lines.append(f"  {function}{f' ({where})' if where else ''} compiled again in this "
                     f"cell ({cause}): {seconds:.2f} s of tracing, lowering and compiling "
                     "inside the time the cell measures. Warm up with the arguments you time "
                     "(the same static values and shapes), or leave the runs that compile out "
                     "of the timing (QuantEcon/lecture-python.myst#663: a warm-up with another "
                     "num_reps).")
    if c.pending_before:
        lines.append(f"{_arrays(c.pending_before)} still being computed when the cell began "
                     "(JAX returns before its work is done): a cell that reads them, or prints "
                     "them, waits for that work, and its seconds include it.")
    if c.pending_after and c.profiler_stop:
        lines.append(f"{_arrays(c.pending_after)} still being computed when the cell ended, "
                     f"and the cell stops a jax.profiler trace ({c.profiler_stop}): work still "
                     "queued when the trace stops is missing from it (JAX returns before its "
                     "work is done). Wait for the result before the trace stops: "
                     "jax.block_until_ready(result) before jax.profiler.stop_trace(), or as the "
                     "last line inside the `with jax.profiler.trace(...)` block "
                     "(jax-ml/jax#38518); at the end of the cell is too late for the trace.")
    elif c.pending_after:
        lines.append(f"{_arrays(c.pending_after)} still being computed when the cell ended: "
                     "its seconds may not include that work. jax.block_until_ready(result) at "
                     "the end of the cell times it.")
    waits = (("reads", "read back", c.waited_lines,
              "each such read (print, float(), .item(), an if, jax.device_get, np.asarray) "
              "waits for the last step queued, and the device idles until the host queues "
              "the next (poets-ai/elegy#141). Read the previous step's value after starting "
              "the next one, or read every k steps; a convergence test belongs in "
              "jax.lax.while_loop. A value the next step takes in (a generated token) needs "
              "no read at all: pass the array itself to the next call and read them all at "
              "the end, or run the whole loop inside jit, jax.lax.while_loop stopping on an "
              "end token, with one read after it (cactus-compute/needle#44)."),
             ("waits", "blocked on", c.blocked_lines,
              "the host queues the next step only after each wait, so the device idles while it "
              "does (AI-Hypercomputer/maxtext#1956; on a CPU 32.9 ms per step blocked each "
              "step, 21.2 ms blocked once). To time steps, time k steps and block once after "
              "them, then divide by k; else leave the block out of the loop."))
    for looks, did, found, why in waits:  # a loop line that waited for the last step queued
        for line, runs, waited, looked in found:
            of = (f"{waited:,} of {looked:,} {looks} looked at" if looked < runs else
                  f"{waited:,} times")
            lines.append(f"{line}: ran {runs:,} times and, {of}, {did} a value still being "
                         f"computed, after which nothing was: {why}")
    if c.timed_lines:
        lines.append("Lines that read the clock while JAX work was still being computed:")
        lines += [f"  {line}: ran {runs:,} times; "
                  + (f"{pending:,} of {looked:,} runs looked at" if looked < runs else
                     f"{pending:,} runs") + " found work still being computed"
                  + (", a timer around a loop of steps" if line in c.timed_loops else "")
                  for line, runs, pending, looked in c.timed_lines]
        lines.append(
            "JAX returns before a step is done, so a time read around a call measures its "
            "dispatch, not the step (p-doom/jasmine#43; on a CPU 0.08 ms timed around the "
            "call, 19.0 ms per step timed over 60 steps). Time k steps and block once, "
            "jax.block_until_ready(out), then divide by k.")
        if c.timed_loops:
            lines.append(
                "A timer around a loop of steps (a per-epoch time) that ends while they are "
                "still being computed times their dispatch, which runs ahead of the work, so "
                "the first epochs look fastest (jax-ml/jax#1797; on a CPU, jax 0.10.2, the "
                "first two epochs took 0.0003 and 0.0001 s, the rest 0.04-0.14 s, and each "
                "0.09-0.18 s with the wait). Wait for all of the loop's last results before "
                "reading the clock: jax.block_until_ready((loss, params)).")
    if c.timer_starts_early:
        lines.append("Timers started while earlier JAX work was still being computed:")
        lines += [f"  {line}: ran {_times(runs)}; {early:,} of {looked:,} timed runs started "
                  f"while {names or 'an array'} {'were' if ', ' in names else 'was'} still "
                  "being computed, and the timed lines waited before its end"
                  for line, runs, early, looked, names in c.timer_starts_early]
        names = ", ".join(n for *_, n in c.timer_starts_early if n)
        ready = f"jax.block_until_ready({names})" if names else \
            "jax.block_until_ready on the timed call's inputs"
        lines.append(
            "A wait inside the timer waits for that earlier work too where the timed call "
            "uses it, so each time is too long, not too short (jax-ml/jax#1219; on a CPU, jax "
            "0.10.2, 6.7-12.8 ms a call timed so, 1.8-3.1 ms with its input waited for first, "
            "medians of 30). Call "
            f"{ready} before the timer starts.")
    if c.untimed_calls:
        lines.append("JAX calls timed with their results thrown away:")
        lines += [f"  {line}: ran {_times(runs)}; {n:,} between two clock reads, nothing "
                  "waiting for its result" for line, runs, n, _ in c.untimed_calls]
        call = c.untimed_calls[0][3]
        lines.append(
            "Nothing waits for the work such a call queues, so the clock read after it "
            "measures its dispatch alone (jax-ml/jax#1219; on a CPU, jax 0.10.2, 0.005 ms timed "
            "so, 2.1-3.7 ms with the result waited for, medians of 30). Wait "
            f"for the result before reading the clock: jax.block_until_ready({call}).")
    if c.read_back_lines:
        lines.append("A Python loop that reads JAX values back to decide what to do:")
        lines += [f"  {line}: ran {runs:,} times, each time reading a JAX value back to Python "
                  f"({calls:,} calls into JAX's Python code outside jit)"
                  for line, runs, calls in c.read_back_lines]
        lines.append(
            "Each operation outside jit is dispatched on its own, and each read back (bool(), "
            "float(), a Python if on a value) waits for it and copies it to the host; jit "
            "cannot trace a Python if on a value. Keep what the loop only reads as NumPy "
            "(np.asarray(table) once, before the loop: micdoh/XLRON#27), or write the branch "
            "as jnp.where or jax.lax.cond inside jit; a test on values the loop computes (a "
            "convergence check) belongs in jax.lax.while_loop.")
    if c.eager_lines:
        lines.append("JAX operations dispatched one by one from a Python loop:")
        lines += [f"  {line}: ran {_times(runs)} and made {calls:,} calls into JAX's Python "
                  "code outside jit" for line, runs, calls in c.eager_lines]
        lines.append(
            "Outside jit each JAX operation is dispatched on its own, a fixed cost of "
            "microseconds that for small arrays is far more than the arithmetic "
            "(jax-ml/jax#968). Jit the loop's body, or the whole loop as jax.lax.fori_loop or "
            "jax.lax.scan, or give each call more work: one call over a batch (jax.vmap; "
            "jax.random.split(key, n) makes n keys at once).")
    if c.rebuilt_lines:
        lines.append("An array copied whole at each write outside jit:")
        lines += [f"  {line}: ran {_times(runs)}; each run made a new {name} "
                  f"({format_bytes(nbytes)}) to write a part of it"
                  for line, runs, name, nbytes in c.rebuilt_lines]
        lines.append(
            "Outside jit, x.at[i].set(v) cannot write in place: it copies all of x into a new "
            "array, and the old one lives until the name is rebound, so each write holds two "
            "copies at its peak (vllm-project/tpu-inference#1748: experts written one by one "
            "into a stacked parameter ran a TPU out of memory). Build the whole array on the "
            "host and put it once (np.stack of the parts, then jax.device_put), or write "
            "inside a jit that donates it: jax.jit(lambda x, v, i: x.at[i].set(v), "
            "donate_argnums=0) writes in place.")
    if c.element_lines:
        lines.append("A jax.Array read one element at a time:")
        lines += [f"  {line}: ran {_times(runs)} and read {n:,} single elements of a jax.Array"
                  for line, runs, n in c.element_lines]
        lines.append(
            "Each x[i] of a jax.Array is its own dispatched operation, with i copied to the "
            "device (jax-ml/jax#390; on a CPU, jax 0.10.2, 1,000 reads took 0.08-0.18 s, "
            "0.0001-0.0006 s from NumPy). Read the array into NumPy "
            "once, xn = np.asarray(x), and index xn.")
    return "\n".join(lines)


def _times(n: int) -> str:
    return "1 time" if n == 1 else f"{n:,} times"


def residuals_text(r: Residuals) -> str:
    lines = [f"jax.grad({r.function}) keeps {format_bytes(r.saved_bytes)} from the forward pass "
             "beyond its arguments"]
    if r.offloaded_bytes:
        lines[0] = (f"jax.grad({r.function}) keeps {format_bytes(r.saved_bytes)} in device "
                    "memory from the forward pass beyond its arguments, and "
                    f"{format_bytes(r.offloaded_bytes)} in {r.offloaded_to} (offloaded by your "
                    "policy)")
    if r.devices > 1:
        lines[0] += (f", summed over the {r.devices} devices a shard_map splits it over: "
                     f"each device keeps {format_bytes(r.device_bytes)}")
    for x in r.residuals[:8]:
        kind = "argument" if x.is_argument else "kept" if x.memory == "device" else \
            f"offloaded to {x.memory}"
        split = (f" = {x.devices} x {x.dtype}{list(x.device_shape)}, "
                 f"{format_bytes(x.nbytes // x.devices)} on each device"
                 if x.devices > 1 else "")
        lines.append(f"  {format_bytes(x.nbytes):>10}  {x.dtype}{list(x.shape)}{split}  "
                     f"[{kind}] {x.source}")
    if len(r.residuals) > 8:
        lines.append(f"  ... and {len(r.residuals) - 8} more")
    if r.advice:
        lines.append(r.advice)
    return "\n".join(lines)


def capped_cell_text(c: CappedCell) -> str:
    label = "STAND-IN (CPU, memory-capped child)" if c.stand_in else "real GPU, capped pool"
    return f"[{label}: {c.cap}]\n{c.output.rstrip()}"


# --- the other records ---------------------------------------------------------------------
def preflight_text(p: Preflight) -> str:
    lines = [f"{p.path} ({format_bytes(p.file_bytes)})"]
    for t in p.tensors:
        lines.append(f"  {t.name}: {t.dtype}{list(t.shape)}  {format_bytes(t.nbytes)}")
    lines.append(f"  total: {format_bytes(p.total_bytes)} ({p.total_bytes:,} bytes)")
    lines.append(f"lands on: {p.device}  ({p.device_reason})")
    lines.append(f"free there: {format_bytes(p.free_bytes)}  ({p.free_source})")
    lines.append(f"verdict: {p.verdict.upper()}")
    if p.advice:
        lines.append(f"  {p.advice}")
    return "\n".join(lines)


def _step_rows(p: StepPreflight) -> list[tuple[str, str]]:
    # the positions, named so: "(donated: 0)" read as no bytes donated (a new user's trial)
    donated = (f" (donated: argument{'s' if len(p.donated) > 1 else ''} "
               f"{', '.join(map(str, p.donated))})" if p.donated else "")
    reuse = [(f"donated argument {d.argument}", f"{format_bytes(d.nbytes)}, "
              + ("reused by an output" if d.reused else f"NOT reused: {d.why}"))
             for d in p.donations]
    total = sum(b for _, b in p.argument_split) or 1
    split = [(f"  {name}", f"{format_bytes(b)} ({b / total:.0%})")
             for name, b in p.argument_split] if len(p.argument_split) > 1 else []
    copies = [(f"  {holder}: copies of the shapes of {of}", ", ".join(
        f"{c.path} {format_bytes(c.nbytes)}" for c in p.state_copies if (c.holder, c.of)
        == (holder, of))) for holder, of in dict.fromkeys((c.holder, c.of) for c in p.state_copies)]
    return [
        ("arguments", format_bytes(p.argument_bytes) + donated),
        *split,
        *copies,
        ("outputs", format_bytes(p.output_bytes)),
        # a value larger than all the temporaries is written as an output: listed under the
        # outputs, not under a temporaries' total smaller than it (a new user's trial)
        *[(f"  a large output: {t.op} {t.dtype}{list(t.shape)}",
           format_bytes(t.nbytes) + (f", {t.line}" if t.line else ""))
          for t in p.largest_temporaries if t.nbytes > p.temp_bytes and t.nbytes >= 1024],
        ("aliased (outputs written into donated arguments)", format_bytes(p.alias_bytes)),
        *reuse,
        ("temporaries", format_bytes(p.temp_bytes)),
        *[(f"  a large one: {t.op} {t.dtype}{list(t.shape)}",
           format_bytes(t.nbytes) + (f", {t.line}" if t.line else ""))
          for t in p.largest_temporaries
          if 1024 <= t.nbytes <= p.temp_bytes],  # a few bytes are no "large one"
        ("generated code", format_bytes(p.code_bytes) if p.code_bytes is not NOT_AVAILABLE
         else "not reported by the CPU backend (XLA gives 0)"),
        *([("constants baked into the program (closed-over arrays"
            + (", values XLA computed" if p.folded_bytes else "") + ")",
            format_bytes(p.constant_bytes))] if p.constant_bytes else []),
        *([("CPU runtime, beyond XLA's plan (convolution copies, sort scratch)",
            format_bytes(p.runtime_bytes))] if p.runtime_bytes else []),
        *([("buffers passed again (XLA's arguments count each place)",
            format_bytes(p.passed_again_bytes))] if p.passed_again_bytes else []),
        ("peak: arguments + outputs - aliased + temporaries"
         + (" - passed again" if p.passed_again_bytes else "")
         + (" + constants" if p.constant_bytes else "")
         + (" + runtime" if p.runtime_bytes else ""), format_bytes(p.peak_bytes)),
        *([("not in the peak: values inside a YNNPACK fusion (CPU, as XLA plans them)",
            format_bytes(p.fusion_bytes))] if p.fusion_bytes else []),
        ("XLA's own peak_memory_in_bytes", format_bytes(p.xla_peak_bytes) + (
            "  (less than the temporaries alone: this backend's figure leaves part of them "
            "out; the peak above is the kit's)" if isinstance(p.xla_peak_bytes, int)
            and p.xla_peak_bytes < p.temp_bytes else "")),
        ("arguments already there (counted in the peak)", format_bytes(p.resident_bytes)),
        *([("arguments XLA dropped (never read; not counted)", format_bytes(p.dropped_bytes))]
          if p.dropped_bytes else []),
        ("the step adds", format_bytes(p.needed_bytes)),
        ("in use there now", f"{format_bytes(p.in_use_bytes)}  ({p.in_use_source})"),
        ("free there", f"{format_bytes(p.free_bytes)}  ({p.free_source})"),
    ]


def step_preflight_text(p: StepPreflight) -> str:
    lines = [f"{p.function} on {p.device}  ({p.device_reason})"]
    rows = _step_rows(p)
    width = max(len(k) for k, _ in rows) + 1
    lines += [f"  {k + ':':<{width}} {v}" for k, v in rows]
    lines.append(f"verdict: {p.verdict.upper()}")
    if p.advice:
        lines.append(f"  {p.advice}")
    return "\n".join(lines)


def step_preflight_html(p: StepPreflight) -> str:
    colour = {"fits": "#1a7f37", "will not fit": "#cf222e", "will fail": "#cf222e"}.get(
        p.verdict, "#9a6700")
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                   for k, v in _step_rows(p))
    advice = f"<br>{html.escape(p.advice)}" if p.advice else ""
    return (f"<b>{html.escape(p.function)}</b> on <code>{html.escape(p.device)}</code> "
            f"({html.escape(p.device_reason)})<table>{rows}</table>"
            f"<b style='color:{colour}'>verdict: {html.escape(p.verdict.upper())}</b>{advice}")


def step_measurement_text(m: StepMeasurement) -> str:
    peak = format_bytes(m.peak_bytes)
    note = f"\n  {m.note}" if m.note else ""
    runs = ""
    if isinstance(m.later_run_peak_bytes, int) and isinstance(m.first_run_peak_bytes, int):
        runs = (f"\n  first run {format_bytes(m.first_run_peak_bytes)}, a later run "
                f"{format_bytes(m.later_run_peak_bytes)}")
    return (f"{m.function} on {m.device}: measured peak {peak} ({m.source}); arguments "
            f"{format_bytes(m.argument_bytes)}; ran {m.seconds:.3f} s{runs}{note}")


def reproduction_text(r: Reproduction) -> str:
    label = "STAND-IN (CPU, memory-capped child)" if r.stand_in else "real GPU"
    head = f"[{'fix' if r.fixed else 'seed load'}] {label}: {r.attempt}"
    if r.ok:
        body = (f"  OK: landed on {r.landed_on}; accelerator bytes added: "
                f"{format_bytes(r.accelerator_bytes_added)}")
    else:
        body = f"  FAILED: {r.error_type}: {r.error_message}"
    return (f"{head}\n  wanted {format_bytes(r.requested_bytes)} on {r.device}, "
            f"budget {'none' if r.budget_bytes is None else format_bytes(r.budget_bytes)} "
            f"({r.budget_how})\n{body}\n"
            f"  exit code {r.exit_code}, {r.elapsed_s:.2f} s")


def snapshot_text(s: MemorySnapshot) -> str:
    lines = [f"{'device':<10} {'in use':>14} {'peak':>14} {'limit':>14}  source"]
    for d in s.devices:
        lines.append(f"{d.device:<10} {format_bytes(d.bytes_in_use):>14} "
                     f"{format_bytes(d.peak_bytes):>14} {format_bytes(d.limit_bytes):>14}  "
                     f"{d.source}")
    lines += [f"{d.device}: {d.note}" for d in s.devices if d.note]
    h = s.host
    lines.append(f"host RSS {format_bytes(h.rss)} (anonymous {format_bytes(h.anon)}, "
                 f"file-backed {format_bytes(h.file)}); "
                 f"available {format_bytes(h.available)} of {format_bytes(h.total)}")
    if s.released_bytes:
        lines.append(f"{format_bytes(s.released_bytes)} of host memory was given back while "
                     "the devices' memory was read: JAX frees some buffers (a NumPy array it "
                     "copied for device_put, among them) only at its next garbage collection, "
                     "which reading memory_stats() runs, as gc.collect() does; until then that "
                     "memory was held (another thread freeing memory meanwhile counts here too)")
    return "\n".join(lines)


def memory_trace_text(t: MemoryTrace) -> str:
    """A tracked block in a few lines: each device's bytes at the start, its peak and at the
    end, the host's RSS and its high-water mark, the marks, and the rates achieved."""
    times, series = t.times, t.device_bytes
    if not times:
        return "memory trace: no samples yet"
    rates = t.achieved_hz_by_source
    asked = f"asked {1 / t.interval:.0f}/s"
    got = ", ".join(f"{k} {v:.0f}/s" for k, v in rates.items())
    lines = [f"memory over {times[-1]:.2f} s{'' if t.finished else ' so far'}, "
             f"{len(times)} samples ({got + '; ' if got else ''}{asked})",
             f"{'device':<10} {'start':>12} {'peak':>12} {'end':>12}  source"]
    for name, s in series.items():
        lines.append(f"{name:<10} {format_bytes(s[0]):>12} {format_bytes(max(s)):>12} "
                     f"{format_bytes(s[-1]):>12}  {t.sources.get(name, '')}")
    rss = t.host_rss
    if t.finished:  # (while it runs, the host's samples come in from a helper at the end)
        lines.append(f"{'host RSS':<10} {format_bytes(rss[0]):>12} "
                     f"{format_bytes(max(rss)):>12} {format_bytes(rss[-1]):>12}  sampled")
        lines.append(f"host RSS high-water mark over the block: {format_bytes(t.host_peak)}")
    else:
        lines.append("host RSS: read when the block ends")
    if t.marks:
        lines.append("marks: " + "; ".join(f"{at:.2f} s {label}" for at, label in t.marks))
    live = [n for n, src in t.sources.items() if src == "live arrays"]
    if live:
        lines.append(f"{', '.join(live)}: live arrays only, so XLA's temporaries inside a call "
                     "never appear; on the CPU the host's high-water mark is the block's peak "
                     "(jax-ml/jax#8096)")
    return "\n".join(lines)


_KIND = {True: "explicit", False: "implicit", None: "?"}


def _copied_size(r: dict) -> str:
    """A summary row's bytes: "?" where no copy's size was logged (jit's fast path), "+?" where
    some were not."""
    if r["unknown_size"] == r["count"]:
        return "?"
    return format_bytes(r["bytes"]) + ("+?" if r["unknown_size"] else "")


def _spelled(size: str) -> str:
    """A summary row's bytes in words where JAX logged none: "?" reads as a missing line (a
    new user's trial). jit's fast path logs a copy with no shape."""
    if size == "?":
        return "bytes not logged"
    return size.replace("+?", " + some not logged")


def transfer_log_text(log: TransferLog) -> str:
    notes = [f"! {n}" for n in getattr(log, "unlogged", ())]
    if not log.transfers:
        return "\n".join(["no transfers", *notes])
    lines = [f"{'direction':<15} {'kind':<9} {'count':>5} {'bytes':>12}"]
    for r in log.summary():
        size = _copied_size(r)
        lines.append(f"{r['direction']:<15} {_KIND[r['explicit']]:<9} {r['count']:>5} "
                     f"{size:>12}")
    by_line = [r for r in log.by_line() if r["line"] != "(line not known)"]
    if by_line:
        lines.append("made by:")
        lines += [f"  {r['count']:>3} x {r['line']}\n        "
                  f"{format_bytes(r['bytes']) if r['bytes'] else 'bytes not logged'}: "
                  f"{'; '.join(r['reasons'])}" for r in by_line]
    return "\n".join(lines + notes)


def transfer_log_html(log: TransferLog) -> str:
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in getattr(log, "unlogged", ()))
    if not log.transfers:
        return "<i>no transfers</i>" + notes
    head = ("<table><tr><th>direction</th><th>kind</th><th>shape</th><th>dtype</th>"
            "<th>bytes</th><th>from</th><th>to</th><th>line</th><th>why</th></tr>")
    rows = []
    for t in log.transfers:
        shape = "?" if t.shape is None else str(list(t.shape))
        cells = (t.direction, _KIND[t.explicit], shape, t.dtype or "?",
                 format_bytes(t.nbytes),
                 t.source or "?", t.destination or "?", t.line or "?", t.reason)
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
                    + "</tr>")
    return head + "".join(rows) + "</table>" + notes


def token_file_text(t: TokenFile) -> str:
    return (f"{t.path}: {t.n_tokens:,} uint16 tokens, {format_bytes(t.nbytes)} "
            f"of data ({format_bytes(t.file_bytes)} on disk)")


def load_table(rows: list[dict]) -> str:
    """A plain-text table of :func:`helpers.loading.medians` rows (fixed-width)."""
    lines = [f"{'strategy':<11} {'seconds':>8} {'peak anon':>11} {'x file':>7} "
             f"{'peak file':>11} {'accelerator':>12}  lands on"]
    for r in rows:
        lines.append(
            f"{r['strategy']:<11} {r['seconds']:>8.2f} "
            f"{format_bytes(r['peak_anon_bytes']):>11} "
            f"{r['peak_anon_bytes'] / r['file_bytes']:>7.2f} "
            f"{format_bytes(r['peak_file_bytes']):>11} "
            f"{'+' + format_bytes(r['accelerator_bytes']):>12}  {r['landed_on']}")
    return "\n".join(lines)



# --- recorded GPU runs ----------------------------------------------------------------------
def gpu_run_text(run) -> str:
    return f"{run.label} ({len(run.notebooks)} notebook copies)"


def recorded_cell_text(c) -> str:
    note = "" if c.same_code else " (this cell's code has changed since that run)"
    body = "\n".join("  " + line for line in (c.text or "(no output)").splitlines())
    return f"{c.run.label}{note}:\n{body}"


def staleness_text(s) -> str:
    if s.run is None:
        return f"{s.notebook}: no GPU-executed copy"
    if s.current:
        return f"{s.notebook}: current ({s.same} code cells, as run on {s.run})"
    total = s.same + len(s.changed) + len(s.missing)
    edited = len(s.changed) + len(s.missing)
    how = {"failed": "it failed", "not run": "it was not run"}.get(s.status or "",
                                                                   f"its status: {s.status}")
    ran = f"; {how} there" if s.status not in (None, "passed") else ""
    return (f"{s.notebook}: stale, {edited} of {total} code cells changed or new since "
            f"{s.run}{ran}" if edited else f"{s.notebook}: stale: {how} on {s.run}")


def batch_size_text(b) -> str:
    nxt = "compiled" if b.next_compiled else "read off the line"
    if b.batch == 0:
        head = (f"{b.function}: no batch fits {format_bytes(b.budget_bytes)} "
                f"(batch {b.granularity} needs {format_bytes(b.next_needed_bytes)})")
    else:
        above = (f"batch {b.batch + b.granularity:,} needs {format_bytes(b.next_needed_bytes)} "
                 f"({nxt})" if isinstance(b.next_needed_bytes, int) else
                 "the largest batch allowed (max_batch): larger ones not tried")
        head = (f"{b.function}: largest batch {b.batch:,} (a multiple of {b.granularity}), "
                f"needs {format_bytes(b.needed_bytes)} of {format_bytes(b.budget_bytes)}; "
                f"{above}")
    return (f"{head}\n  {format_bytes(b.bytes_per_example)} per example + "
            f"{format_bytes(b.fixed_bytes)} fixed; {b.compiles} compiles, {b.seconds:.2f} s, "
            f"no run ({b.method})")


def pool_prediction_text(p) -> str:
    """The pool XLA builds on a GPU, in one sentence: its cap, what the first allocation takes
    from the driver (what nvidia-smi shows as used from then on), and memory_stats()'s limit."""
    if p.allocator == "platform":  # no pool at all
        return ("no pool: each buffer is its own cudaMalloc and cudaFree, so nvidia-smi shows "
                "what the live buffers hold (and the CUDA context); no XLA cap, "
                "memory_stats() is None.")
    cap = "the whole card (no cap of XLA's)" if p.cap_bytes is None else format_bytes(p.cap_bytes)
    limit = ("memory_stats() is None" if p.reported_limit is None else
             f"memory_stats()['bytes_limit'] {format_bytes(p.reported_limit)}")
    taken = (f"taken from the driver at the first allocation: {format_bytes(p.upfront_bytes)} "
             "(what nvidia-smi shows as used from then on, beside the CUDA context's few "
             "hundred MiB)" if p.upfront_bytes else
             "nothing taken up front: it grows on demand, and nvidia-smi shows what it has "
             "grown to")
    return f"{p.allocator} pool of up to {cap}; {taken}; {limit}. {p.note}."


def target_text(t) -> str:
    """The budget on a card, in one sentence, and the pool under it."""
    return (f"{t.card.name} ({format_bytes(t.card.total_bytes)}): "
            f"{format_bytes(t.budget_bytes)} for this process ({t.note}).\n"
            f"  {pool_prediction_text(t.pool)}")


records.renders("helpers.devices.DeviceReport", text=report_text, html=report_html)
records.renders("helpers.devices.ProcessView", text=process_view_text)
records.renders("helpers.processes.Job", text=job_text)
records.renders("helpers.processes.ProcessReport", text=process_report_text)
records.renders("helpers.devices.Placement", text=placement_text, html=placement_html)
records.renders("helpers.holders.Holders", text=holders_text)
records.renders("helpers.preflight.Residuals", text=residuals_text)
records.renders("helpers.ipython.CellMemory", text=cell_memory_text)
records.renders("helpers.oom.OomReport", text=oom_report_text)
records.renders("helpers.oom.LibraryFailure", text=library_failure_text)
records.renders("helpers.oom.CappedCell", text=capped_cell_text)
records.renders("helpers.settings.ProcessCheck", text=process_check_text)
records.renders("helpers.devices.TreePlacement", text=tree_placement_text,
                html=tree_placement_html)
records.renders("helpers.preflight.Preflight", text=preflight_text)
records.renders("helpers.oom.Reproduction", text=reproduction_text)
records.renders("helpers.measure.StepMeasurement", text=step_measurement_text)
records.renders("helpers.preflight.StepPreflight", text=step_preflight_text,
                html=step_preflight_html)
records.renders("helpers.memory.MemorySnapshot", text=snapshot_text)
records.renders("helpers.memory.MemoryTrace", text=memory_trace_text)
records.renders("helpers.compiles.CompileLog", text=compile_log_text)
records.renders("helpers.transfers.TransferLog", text=transfer_log_text, html=transfer_log_html)
records.renders("helpers.datasets.TokenFile", text=token_file_text)
records.renders("helpers.recorded.GpuRun", text=gpu_run_text)
records.renders("helpers.recorded.RecordedCell", text=recorded_cell_text)
records.renders("helpers.recorded.Staleness", text=staleness_text)
records.renders("helpers.sizing.BatchSize", text=batch_size_text)
records.renders("helpers.allocation.PoolPrediction", text=pool_prediction_text)
records.renders("helpers.allocation.Target", text=target_text)
