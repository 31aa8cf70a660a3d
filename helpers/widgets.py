"""A live memory view for JupyterLab, built on anywidget.

``MemoryMonitor()`` shows bytes per device and host now, and a timeline of the last samples. The
kernel only sends numbers: a background thread takes a :func:`helpers.memory.snapshot` every
``interval`` seconds and sets one synced trait (``data``: times, bytes per device, host memory,
plain lists); the browser draws the table (devices and host) and the timeline of device bytes
itself (an SVG, in the widget's own JavaScript, ``_esm``). So watching costs the kernel a
snapshot per refresh, not a matplotlib figure. Outside a notebook the monitor shows as text
(``str(monitor)``).

>>> monitor = MemoryMonitor(interval=0.5)   # display(monitor) in a notebook, then Start
>>> monitor.update(); monitor.update()
>>> monitor.updates, len(monitor.data["times"]), monitor.running
(2, 2, False)
>>> monitor.close()
"""

from __future__ import annotations

import threading
import weakref
from collections import deque

import anywidget
import traitlets

from helpers import memory
from helpers.errors import BadInputError
from helpers.units import NOT_AVAILABLE, format_bytes

__all__ = ["MemoryMonitor"]

_ESM = r"""
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

function fmt(n) {
  if (n === null || n === undefined) return "not available";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? `${v} B` : `${v.toFixed(2)} ${units[i]}`;
}

function el(tag, attrs = {}, text = "") {
  const e = tag === "svg" || tag === "polyline" || tag === "text" || tag === "line"
    ? document.createElementNS(NS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

function render({ model, el: root }) {
  root.classList.add("jdk-monitor");
  const start = el("button", { class: "jdk-start" }, "Start");
  const stop = el("button", { class: "jdk-stop" }, "Stop");
  const status = el("span", { class: "jdk-status" });
  const bar = el("div", { class: "jdk-bar" });
  bar.append(start, stop, status);
  const table = el("table", { class: "jdk-table" });
  const W = 600, H = 150, PAD = 4;
  const svg = el("svg", { class: "jdk-timeline", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  const legend = el("div", { class: "jdk-legend" });
  root.append(bar, table, svg, legend);

  function draw() {
    const running = model.get("running");
    start.disabled = running;
    stop.disabled = !running;
    status.textContent = model.get("status");
    const d = model.get("data") || {};
    const times = d.times || [];
    const names = Object.keys(d.devices || {});
    const rows = names.map((n) => {
      const s = d.devices[n];
      const source = (d.sources || {})[n] || "";
      return `<tr><td>${n}</td><td>${fmt(s[s.length - 1])}</td><td>${source}</td></tr>`;
    });
    const rss = d.host_rss || [];
    const host = rss.length
      ? `<tr><td>host RSS</td><td>${fmt(rss[rss.length - 1])}</td><td>process</td></tr>` : "";
    table.innerHTML = "<tr><th>device</th><th>in use</th><th>source</th></tr>" +
      rows.join("") + host;
    svg.replaceChildren();
    legend.replaceChildren();
    if (times.length < 2) {
      const t = el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "jdk-wait" },
        running || times.length ? "the timeline draws from the second sample on"
                                : "press Start: the timeline draws from the second sample on");
      svg.append(t);
      return;
    }
    const series = names.map((n) => [n, d.devices[n]]);  // devices only: host RSS is in the table
    const t0 = times[0], t1 = times[times.length - 1] || 1;
    const top = Math.max(1, ...series.flatMap(([, s]) => s.filter((v) => v !== null)));
    series.forEach(([name, s], i) => {
      const color = COLORS[i % COLORS.length];
      const pts = s.map((v, j) => v === null ? null :
        `${(PAD + (times[j] - t0) / (t1 - t0 || 1) * (W - 2 * PAD)).toFixed(1)},` +
        `${(H - PAD - v / top * (H - 2 * PAD)).toFixed(1)}`).filter((p) => p !== null);
      svg.append(el("polyline", { points: pts.join(" "), fill: "none", stroke: color,
        "stroke-width": i === 0 ? 3 : 1.5, "data-series": name }));
      const item = el("span", { class: "jdk-key", style: `color:${color}` }, `■ ${name}  `);
      legend.append(item);
    });
    legend.append(el("span", { class: "jdk-scale" },
      `top: ${fmt(top)}; ${(t1 - t0).toFixed(1)} s`));
  }

  start.addEventListener("click", () => { model.set("running", true); model.save_changes(); });
  stop.addEventListener("click", () => { model.set("running", false); model.save_changes(); });
  model.on("change:data", draw);
  model.on("change:running", draw);
  model.on("change:status", draw);
  draw();
  return () => {
    model.off("change:data", draw);
    model.off("change:running", draw);
    model.off("change:status", draw);
  };
}
export default { render };
"""

_CSS = """
.jdk-monitor { font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px; }
.jdk-monitor .jdk-bar { display: flex; gap: 6px; align-items: center; margin-bottom: 4px; }
.jdk-monitor .jdk-table td, .jdk-monitor .jdk-table th { padding: 1px 8px; text-align: left; }
.jdk-monitor .jdk-timeline { border: 1px solid #ddd; background: #fff; }
.jdk-monitor .jdk-wait { fill: #666; font-size: 12px; }
"""


class MemoryMonitor(anywidget.AnyWidget):
    """Start/Stop, current bytes per device and host, and a timeline drawn in the browser."""

    _esm = _ESM
    _css = _CSS
    #: what the browser draws: ``memory.samples_to_dict`` of the last ``history`` samples
    data = traitlets.Dict().tag(sync=True)
    #: True while the refresh thread runs; the browser's Start and Stop set it
    running = traitlets.Bool(False).tag(sync=True)
    status = traitlets.Unicode("stopped").tag(sync=True)

    def __init__(self, *, interval: float = 0.5, history: int = 240, devices=None,
                 autostart: bool = False):
        if not isinstance(interval, (int, float)) or not 0.05 <= float(interval) <= 60:
            raise BadInputError(f"interval must be between 0.05 and 60 seconds, got {interval!r}")
        if not isinstance(history, int) or history < 2:
            raise BadInputError(f"history must be an int >= 2, got {history!r}")
        super().__init__()
        self.interval = float(interval)
        self._devices = devices
        self._samples: deque = deque(maxlen=history)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.updates = 0  # how many refreshes have been sent
        self.observe(self._on_running, names="running")
        if autostart:
            self.start()

    # --- the thread --------------------------------------------------------------------------
    def _on_running(self, change) -> None:
        """The browser (or Python) set ``running``: start or stop the thread to match."""
        if change["new"] and not self._alive():
            self._start_thread()
        elif not change["new"] and self._alive():
            self._stop_thread()

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start_thread(self) -> None:
        self._stop = threading.Event()  # one event per run: an old thread never sees a new one
        weakref.finalize(self, self._stop.set)  # garbage-collected while running: stop
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop),
                                        name="helpers.widgets.MemoryMonitor", daemon=True)
        self.status = "running"
        self._thread.start()

    def _stop_thread(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        self.status = f"stopped after {_refreshes(self.updates)}"

    def start(self) -> None:
        """Refresh every ``interval`` seconds in a background thread (no-op if it runs). The
        thread holds the monitor only through a weak reference."""
        if not self._alive():
            self.running = True  # the observer starts the thread
            if not self._alive():  # running was already True (a thread that died)
                self._start_thread()

    def stop(self) -> None:
        """Stop refreshing and wait for the thread to end."""
        if self.running:
            self.running = False  # the observer stops the thread
        if self._alive():
            self._stop_thread()

    def close(self) -> None:
        """Stop the thread, then close the widget (it leaves the page)."""
        if hasattr(self, "_lock"):  # absent when __init__ refused its arguments
            self.stop()
        super().close()

    def __enter__(self) -> MemoryMonitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- samples -----------------------------------------------------------------------------
    @property
    def samples(self) -> tuple:
        with self._lock:
            return tuple(self._samples)

    def update(self) -> None:
        """Take one sample and send the numbers (the thread calls this; tests may too)."""
        snap = memory.snapshot(self._devices)
        with self._lock:
            self._samples.append(snap)
            samples = tuple(self._samples)
        self.data = memory.samples_to_dict(samples)
        self.updates += 1
        if self._alive():
            self.status = f"running: {_refreshes(self.updates)}"

    def __repr__(self) -> str:
        """Text outside a notebook: the state and the latest numbers."""
        head = f"MemoryMonitor ({self.status}, every {self.interval:g} s, {len(self.samples)} "\
               "samples)"
        latest = self.samples[-1] if self.samples else None
        if latest is None:
            return head + ": no sample yet (update() or start())"
        rows = [f"  {d.device:<8} {format_bytes(d.bytes_in_use):>12}  ({d.source})"
                for d in latest.devices]
        rss = latest.host.rss if latest.host.rss is not None else NOT_AVAILABLE
        return "\n".join([head, *rows, f"  host RSS {format_bytes(rss):>12}"])

    __str__ = __repr__


def _run(ref: weakref.ref, stop: threading.Event) -> None:
    """The refresh thread: update the monitor while it lives and is not stopped."""
    while not stop.is_set():
        monitor = ref()
        if monitor is None:
            return
        try:
            monitor.update()
        except Exception as err:  # keep the kernel alive; say what happened
            monitor.status = f"stopped: {type(err).__name__}: {err}"
            return
        wait = monitor.interval
        del monitor  # hold it only while refreshing
        stop.wait(wait)


def _refreshes(n: int) -> str:
    return f"{n} refresh" if n == 1 else f"{n} refreshes"
