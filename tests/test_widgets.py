import threading
import time

import jax
import numpy as np
import pytest

from helpers.widgets import MemoryMonitor


def monitor_threads():
    return [t for t in threading.enumerate() if t.name == "helpers.widgets.MemoryMonitor"]


def wait_for(condition, seconds=20):
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.05)
    return condition()


def test_monitor_starts_sends_numbers_and_stops_headless():
    m = MemoryMonitor(interval=0.05)
    assert not m.running and m.status == "stopped" and m.data == {}
    m.start()
    assert m.running and len(monitor_threads()) == 1
    x = jax.device_put(np.ones(100_000, np.float32), jax.devices()[1])
    assert wait_for(lambda: m.updates >= 3)
    m.stop()
    assert not m.running and monitor_threads() == []
    d = m.data  # plain numbers for the browser: no image is made in the kernel
    assert set(d["devices"]) >= {"cpu:0", "cpu:1"} and len(d["times"]) == len(d["host_rss"])
    assert all(isinstance(v, int) for v in d["devices"]["cpu:1"])
    assert d["devices"]["cpu:1"][-1] >= x.nbytes
    assert m.status == f"stopped after {m.updates} refreshes"
    del x


def test_the_browser_starts_and_stops_it_through_the_running_trait():
    m = MemoryMonitor(interval=0.05)
    m.set_state({"running": True})  # what the Start button's model.save_changes() sends
    assert m.running and wait_for(lambda: m.updates >= 2)
    assert m.status.startswith("running: ") and m.status.endswith(" refreshes")
    m.set_state({"running": False})
    assert monitor_threads() == [] and m.status.startswith("stopped after")
    m.close()


def test_update_by_hand_and_the_text_view():
    m = MemoryMonitor(interval=1)
    assert "no sample yet" in str(m)
    m.update()
    m.update()
    assert m.updates == 2 and len(m.samples) == 2 and len(m.data["times"]) == 2
    assert m.status == "stopped"  # refreshes by hand do not claim to be running
    text = str(m)
    assert text.startswith("MemoryMonitor (stopped, every 1 s, 2 samples)")
    assert "cpu:0" in text and "host RSS" in text
    assert repr(m) == text  # what a terminal or a saved notebook shows
    m.close()


def test_history_is_bounded():
    m = MemoryMonitor(interval=1, history=3)
    for _ in range(5):
        m.update()
    assert len(m.samples) == 3 and len(m.data["times"]) == 3
    m.close()


@pytest.mark.parametrize("kwargs", [{"interval": 0}, {"interval": "fast"}, {"history": 1}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="interval|history"):
        MemoryMonitor(**kwargs)


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
