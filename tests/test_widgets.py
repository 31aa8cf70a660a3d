import threading
import time

import jax
import numpy as np
import pytest

from helpers.widgets import _BEFORE_START, _ONE_SAMPLE, MemoryMonitor, _placeholder_png


def monitor_threads():
    return [t for t in threading.enumerate() if t.name == "helpers.widgets.MemoryMonitor"]


def test_monitor_constructs_starts_updates_and_stops_headless():
    m = MemoryMonitor(interval=0.05)
    assert not m.running and m.stop_button.disabled
    assert m.image.value == _placeholder_png(_BEFORE_START)  # no empty plot before Start
    m.start()
    assert m.running and m.start_button.disabled
    x = jax.device_put(np.ones(100_000, np.float32), jax.devices()[1])
    deadline = time.time() + 20
    while m.updates < 3 and time.time() < deadline:
        time.sleep(0.05)
    m.stop()
    assert m.updates >= 3
    assert not m.running and monitor_threads() == []
    assert m.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cpu:1" in m.table.value and "host RSS" in m.table.value
    assert "stopped after" in m.status.value
    del x


def test_update_without_thread_and_buttons():
    m = MemoryMonitor(interval=1)
    m.update()
    assert m.updates == 1 and len(m.samples) == 1
    m.start_button.click()
    assert m.running
    m.stop_button.click()
    assert not m.running


def test_timeline_needs_two_samples_and_the_status_counts_refreshes():
    """One sample has no time span (the plot would show a made-up axis, -0.04 to 0.04 s)."""
    m = MemoryMonitor(interval=1)
    before = m.image.value
    assert before[:8] == b"\x89PNG\r\n\x1a\n"
    m.update()
    assert m.image.value == _placeholder_png(_ONE_SAMPLE) != before
    m.update()
    assert m.image.value not in (before, _placeholder_png(_ONE_SAMPLE))  # the real timeline
    assert m.status.value == "stopped"  # refreshes by hand do not claim to be running
    m.interval.value = 0.05
    m.start()
    deadline = time.time() + 20
    while m.updates < 4 and time.time() < deadline:
        time.sleep(0.05)
    assert m.status.value.startswith("running: ") and m.status.value.endswith(" refreshes")
    m.stop()
    assert m.status.value == f"stopped after {m.updates} refreshes"


def test_bad_interval():
    with pytest.raises(ValueError, match="interval"):
        MemoryMonitor(interval=0)


def test_close_stops_the_thread_and_the_widget():
    m = MemoryMonitor(interval=0.05, autostart=True)
    assert m.running and len(monitor_threads()) == 1
    m.close()
    assert not m.running and monitor_threads() == []
    assert m.comm is None  # ipywidgets: closed


def test_a_context_manager_closes_it():
    with MemoryMonitor(interval=0.05, autostart=True) as m:
        assert m.running
    assert monitor_threads() == [] and m.comm is None


def test_a_monitor_garbage_collected_while_running_stops_its_thread():
    import gc
    import weakref

    import ipywidgets

    m = MemoryMonitor(interval=0.05, autostart=True)
    ipywidgets.Widget.close(m)  # leaves ipywidgets' registry without stopping the thread
    gone = weakref.ref(m)
    del m
    gc.collect()
    deadline = time.monotonic() + 10
    while monitor_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone() is None and monitor_threads() == []


def test_the_table_says_when_the_os_has_no_anonymous_split(monkeypatch):
    from helpers import memory
    from helpers.units import NOT_AVAILABLE

    snap = memory.snapshot()
    host = type(snap.host)(**{**snap.host.__dict__, "anon": NOT_AVAILABLE,
                              "file": NOT_AVAILABLE})
    html = MemoryMonitor._table_html(type(snap)(snap.time, snap.devices, host))
    host_line = html.split("<div>")[-1]
    assert "no split on this OS" in host_line and "not available" not in host_line
