"""helpers.widgets.MemoryMonitor live in JupyterLab: it renders, Start refreshes it (the count
grows, the timeline changes), Stop stops it. Screenshots go to tests/artifacts/."""

from __future__ import annotations

import re
import time

from tests.browser import ARTIFACTS
from tests.browser.driver import NOTEBOOK, write_notebook

INTERVAL_S = 0.25
FIRST_REFRESHES_S = 15.0  # 3 refreshes take about 1 s; room for a busy 2-core machine
SCREENSHOT = ARTIFACTS / "memory_monitor.png"
SCREENSHOT_BEFORE = ARTIFACTS / "memory_monitor_before_start.png"

# The image widget shows a blob: URL; read the bytes it points to (None if it was just revoked
# by the next refresh) and fold them into a number.
_IMAGE_JS = """async img => {
  if (!img.src || !img.complete || img.naturalWidth === 0) return null;
  try {
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let h = 2166136261;
    for (const b of bytes) h = Math.imul(h ^ b, 16777619) >>> 0;
    return `${bytes.length}:${h}`;
  } catch (e) { return null; }
}"""


def _count(status: str) -> int:
    found = re.search(r"(\d+) refresh", status)
    return int(found.group(1)) if found else 0


def _read(widget):
    """(status text, refresh count, image fingerprint or None)."""
    status = widget.get_by_text(re.compile(r"^(running|stopped)")).inner_text().strip()
    return status, _count(status), widget.locator("img").evaluate(_IMAGE_JS)


def _image(widget, timeout_s: float = 10):
    deadline = time.monotonic() + timeout_s
    while (fingerprint := widget.locator("img").evaluate(_IMAGE_JS)) is None:
        assert time.monotonic() < deadline, "the widget's image never loaded"
        time.sleep(0.1)
    return fingerprint


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

    widget = page.locator(f"{NOTEBOOK} .jp-OutputArea-output .widget-vbox").first
    widget.wait_for(state="visible")
    start, stop = (widget.get_by_role("button", name=n) for n in ("Start", "Stop"))
    assert start.is_enabled() and stop.is_disabled()
    status, count, _ = _read(widget)
    assert (status, count) == ("stopped", 0)
    placeholder = _image(widget)  # "press Start", not an empty plot
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    widget.screenshot(path=str(SCREENSHOT_BEFORE))

    start.click()
    clicked, seen = time.monotonic(), {}  # refresh count -> image fingerprint
    while time.monotonic() - clicked < FIRST_REFRESHES_S and len(seen) < 4:
        status, count, image = _read(widget)
        if count and image:
            seen.setdefault(count, image)
        time.sleep(0.05)
    took = time.monotonic() - clicked
    counts = sorted(seen)
    assert len(counts) >= 3 and counts[-1] >= 3, (
        f"refresh counts seen within {took:.1f} s of Start: {counts}; status {status!r}")
    assert status.startswith("running"), status
    assert len(set(seen.values())) >= 2, f"the timeline did not change between refreshes {seen}"
    assert placeholder not in seen.values()

    stop.click()
    deadline = time.monotonic() + 10
    while not (status := _read(widget)[0]).startswith("stopped after"):
        assert time.monotonic() < deadline, f"Stop did not stop the monitor: status {status!r}"
        time.sleep(0.1)
    status, count, _ = _read(widget)
    image = _image(widget)
    assert count >= counts[-1]
    time.sleep(8 * INTERVAL_S)  # eight intervals: a running monitor would refresh here
    assert _read(widget)[:2] == (status, count), "the monitor kept refreshing after Stop"
    assert _image(widget) == image, "the timeline changed after Stop"
    assert start.is_enabled() and stop.is_disabled()
    widget.screenshot(path=str(SCREENSHOT))
    print(f"MemoryMonitor: {counts[-1]} refreshes {took:.1f} s after Start, stopped at {count};"
          f" screenshot {SCREENSHOT}")
