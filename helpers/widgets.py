"""Live views for JupyterLab (ipywidgets 8).

``MemoryMonitor()`` shows bytes per device and host now, and a small timeline of the last
samples, refreshed from a background thread. Until there are two samples the image is a
"press Start" placeholder, not an empty plot. The thread only sets widget traits
(``HTML.value``, ``Image.value``), which ipywidgets syncs to the browser; it never writes
through ``with output:``, which is not safe from a thread.

>>> monitor = MemoryMonitor(interval=0.5)   # display(monitor) in a notebook, then Start
"""

from __future__ import annotations

import functools
import html
import io
import threading
import weakref
from collections import deque

import ipywidgets as widgets

from helpers import memory
from helpers.errors import BadInputError
from helpers.units import NotAvailable, format_bytes

__all__ = ["MemoryMonitor"]


class MemoryMonitor(widgets.VBox):
    """Start/stop, refresh interval, current bytes per device and host, timeline image."""

    def __init__(self, *, interval: float = 0.5, history: int = 240, devices=None,
                 autostart: bool = False):
        if not 0.05 <= float(interval) <= 60:
            raise BadInputError(f"interval must be between 0.05 and 60 seconds, got {interval!r}")
        self._devices = devices
        self._samples: deque = deque(maxlen=int(history))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0: float | None = None
        self.updates = 0  # how many refreshes have been drawn
        self.start_button = widgets.Button(description="Start", icon="play",
                                           button_style="success")
        self.stop_button = widgets.Button(description="Stop", icon="stop", disabled=True)
        self.interval = widgets.BoundedFloatText(value=float(interval), min=0.05, max=60,
                                                 step=0.05, description="every (s)",
                                                 layout=widgets.Layout(width="160px"))
        self.status = widgets.Label("stopped")
        self.table = widgets.HTML("<i>press Start</i>")
        self.image = widgets.Image(value=_placeholder_png(_BEFORE_START), format="png",
                                   layout=widgets.Layout(max_width="640px"))
        me = weakref.ref(self)  # the buttons outlive nothing: they must not keep the monitor
        self.start_button.on_click(lambda _b: (m := me()) is not None and m.start())
        self.stop_button.on_click(lambda _b: (m := me()) is not None and m.stop())
        super().__init__([
            widgets.HBox([self.start_button, self.stop_button, self.interval, self.status]),
            self.table,
            self.image,
        ])
        if autostart:
            self.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def samples(self) -> tuple:
        with self._lock:
            return tuple(self._samples)

    def start(self) -> None:
        """Start refreshing every ``interval`` seconds in a background thread (no-op if it
        runs). The thread holds the monitor only through a weak reference."""
        if self.running:
            return
        self._stop = threading.Event()  # one event per run: an old thread never sees a new one
        weakref.finalize(self, self._stop.set)  # garbage-collected while running: stop
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop),
                                        name="helpers.widgets.MemoryMonitor", daemon=True)
        self.start_button.disabled, self.stop_button.disabled = True, False
        self.status.value = "running"
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing and wait for the thread to end."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        self.start_button.disabled, self.stop_button.disabled = False, True
        self.status.value = f"stopped after {_refreshes(self.updates)}"

    def close(self) -> None:
        """Stop the thread, then close the widget and its parts (they leave the page)."""
        if hasattr(self, "_thread"):  # absent when __init__ refused its arguments
            self.stop()
        for part in (self.start_button, self.stop_button, self.interval, self.status,
                     self.table, self.image, *self.children) if hasattr(self, "image") else ():
            part.close()
        super().close()

    def __enter__(self) -> MemoryMonitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self) -> None:
        """Take one sample and redraw (the thread calls this; tests may too)."""
        snap = memory.snapshot(self._devices)
        with self._lock:
            if self._t0 is None:
                self._t0 = snap.time
            self._samples.append(snap)
            samples = tuple(self._samples)
        self.table.value = self._table_html(snap)
        self.image.value = self._timeline_png(samples)
        self.updates += 1
        if self.running:
            self.status.value = f"running: {_refreshes(self.updates)}"

    @staticmethod
    def _table_html(snap) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(d.device)}</td><td>{format_bytes(d.bytes_in_use)}</td>"
            f"<td>{format_bytes(d.limit_bytes)}</td><td>{html.escape(d.source)}</td></tr>"
            for d in snap.devices)
        h = snap.host
        split = ("no split on this OS" if isinstance(h.anon, NotAvailable) else
                 f"anonymous {format_bytes(h.anon)}, file-backed {format_bytes(h.file)}")
        return ("<table><tr><th>device</th><th>in use</th><th>limit</th><th>source</th></tr>"
                f"{rows}</table><div>host RSS {format_bytes(h.rss)} ({split})</div>")

    def _timeline_png(self, samples) -> bytes:
        from helpers import plotting

        if len(samples) < 2:  # one sample has no time span: matplotlib would invent one
            return _placeholder_png(_ONE_SAMPLE)
        data = memory.samples_to_dict(samples)
        fig = plotting.memory_timeline(data, title="Live memory")
        fig.set_size_inches(6.4, 2.6)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        return buf.getvalue()


def _run(ref: weakref.ref, stop: threading.Event) -> None:
    """The refresh thread: update the monitor while it lives and is not stopped."""
    while not stop.is_set():
        monitor = ref()
        if monitor is None:
            return
        try:
            monitor.update()
        except Exception as err:  # keep the kernel alive; say what happened
            monitor.status.value = f"stopped: {type(err).__name__}: {err}"
            return
        wait = max(0.05, float(monitor.interval.value))
        del monitor  # hold it only while refreshing
        stop.wait(wait)


_BEFORE_START = "Press Start: the timeline draws from the second sample on."
_ONE_SAMPLE = "1 sample so far: the timeline draws from the second sample on."


def _refreshes(n: int) -> str:
    return f"{n} refresh" if n == 1 else f"{n} refreshes"


@functools.lru_cache(maxsize=4)
def _placeholder_png(text: str) -> bytes:
    """The timeline's size, no axes, one line of text: shown until there is a time span."""
    import matplotlib.style
    from matplotlib.patches import Rectangle

    from helpers.plotting import STYLE, figure

    with matplotlib.style.context(STYLE):
        fig = figure(figsize=(6.4, 2.6))
        fig.add_artist(Rectangle((0.01, 0.02), 0.98, 0.96, transform=fig.transFigure,
                                 fill=False, edgecolor="0.85"))
        fig.text(0.5, 0.5, text, ha="center", va="center", color="0.35")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()
