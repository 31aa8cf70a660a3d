"""helpers.widgets.MemoryMonitor live in JupyterLab: it renders (anywidget: the browser draws an
SVG timeline from the numbers the kernel sends), Start refreshes it (the count grows, the timeline
changes), Stop stops it. Screenshots go to tests/artifacts/."""

from __future__ import annotations

import re
import time

from tests.browser import ARTIFACTS
from tests.browser.driver import NOTEBOOK, write_notebook

INTERVAL_S = 0.25
FIRST_REFRESHES_S = 15.0  # 3 refreshes take about 1 s; room for a busy 2-core machine
SCREENSHOT = ARTIFACTS / "memory_monitor.png"
SCREENSHOT_BEFORE = ARTIFACTS / "memory_monitor_before_start.png"

# The timeline is an SVG drawn in the browser: its polylines' points, folded into one string
# (empty before there are two samples, when it shows the "press Start" text instead).
_TIMELINE_JS = """svg => Array.from(svg.querySelectorAll('polyline'))
  .map(p => p.getAttribute('data-series') + ':' + p.getAttribute('points')).join('|')"""


def _count(status: str) -> int:
    found = re.search(r"(\d+) refresh", status)
    return int(found.group(1)) if found else 0


def _read(widget):
    """(status text, refresh count, timeline fingerprint: "" before two samples)."""
    status = widget.locator(".jdk-status").inner_text().strip()
    return status, _count(status), widget.locator("svg.jdk-timeline").evaluate(_TIMELINE_JS)


def test_memory_monitor_live(run, page, lab):
    path = write_notebook(lab.notebooks, "memory_monitor.ipynb", [
        "import jax\n\n"
        "jax.config.update('jax_num_cpu_devices', 4)  # the kit's stand-in, as in the notebooks\n"
        "import numpy as np\n\n"
        "from helpers.widgets import MemoryMonitor\n\n"
        "x = jax.device_put(np.ones(2**20, np.float32), jax.devices()[1])  # 4 MiB on cpu:1\n"
        f"monitor = MemoryMonitor(interval={INTERVAL_S})\n"
        "monitor"])
    problems, _ = run(path)
    assert problems == []

    widget = page.locator(f"{NOTEBOOK} .jp-OutputArea-output .jdk-monitor").first
    widget.wait_for(state="visible")
    start, stop = (widget.get_by_role("button", name=n) for n in ("Start", "Stop"))
    assert start.is_enabled() and stop.is_disabled()
    status, count, timeline = _read(widget)
    assert (status, count, timeline) == ("stopped", 0, "")
    assert "press Start" in widget.locator("svg.jdk-timeline").text_content()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    widget.screenshot(path=str(SCREENSHOT_BEFORE))

    start.click()
    clicked, seen = time.monotonic(), {}  # refresh count -> timeline fingerprint
    while time.monotonic() - clicked < FIRST_REFRESHES_S and len(seen) < 4:
        status, count, timeline = _read(widget)
        if count and timeline:
            seen.setdefault(count, timeline)
        time.sleep(0.05)
    took = time.monotonic() - clicked
    counts = sorted(seen)
    assert len(counts) >= 3 and counts[-1] >= 3, (
        f"refresh counts seen within {took:.1f} s of Start: {counts}; status {status!r}")
    assert status.startswith("running"), status
    assert len(set(seen.values())) >= 2, f"the timeline did not change between refreshes {seen}"
    assert "cpu:1" in widget.locator(".jdk-table").inner_text()  # the table, drawn in the page

    stop.click()
    deadline = time.monotonic() + 10
    while not (status := _read(widget)[0]).startswith("stopped after"):
        assert time.monotonic() < deadline, f"Stop did not stop the monitor: status {status!r}"
        time.sleep(0.1)
    status, count, timeline = _read(widget)
    assert count >= counts[-1]
    time.sleep(8 * INTERVAL_S)  # eight intervals: a running monitor would refresh here
    assert _read(widget) == (status, count, timeline), "the monitor kept refreshing after Stop"
    assert start.is_enabled() and stop.is_disabled()
    widget.screenshot(path=str(SCREENSHOT))
    print(f"MemoryMonitor: {counts[-1]} refreshes {took:.1f} s after Start, stopped at {count};"
          f" screenshot {SCREENSHOT}")
