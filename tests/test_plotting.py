import time

import jax
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from helpers import memory, plotting, transfers


@pytest.fixture(scope="module")
def trace():
    with memory.track(interval=0.01) as t:
        x = jax.device_put(np.ones(500_000, np.float32), jax.devices()[1])
        t.mark("loaded")
        time.sleep(0.05)
        del x
    return t


def test_timeline_is_a_figure_with_marks_and_binary_units(trace):
    before = plt.get_fignums()
    fig = plotting.memory_timeline(trace)
    assert isinstance(fig, Figure) and plt.get_fignums() == before  # no pyplot state
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(lbl.startswith("cpu:1") for lbl in labels)
    assert "host anonymous" in labels or "host RSS" in labels
    assert ax.get_ylabel() in ("B", "KiB", "MiB", "GiB")
    assert any(t.get_text() == "loaded" for t in ax.texts)
    named = plotting.memory_timeline(trace, devices=["cpu:1"], labels={jax.devices()[1]: "host"})
    assert named.axes[0].get_legend().get_texts()[0].get_text().startswith("cpu:1 host (")


def test_timeline_from_plain_dict_draws_limit_line():
    data = {"times": [0, 1, 2], "devices": {"cuda:0": [0, 3 * 2**30, 1 * 2**30]},
            "limits": {"cuda:0": 4 * 2**30}, "sources": {"cuda:0": "allocator"},
            "host_anon": [2**30] * 3, "host_file": [2**29] * 3, "host_rss": [2**31] * 3,
            "marks": [[1.0, "load"]]}
    fig = plotting.memory_timeline(data)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "GiB"
    dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(dashed) == 1 and dashed[0].get_ydata()[0] == 4.0  # 4 GiB, in GiB units
    assert ax.get_ylim()[1] >= 4.0


def test_timeline_errors():
    with pytest.raises(ValueError, match="no samples"):
        plotting.memory_timeline({"times": [], "devices": {}})
    with pytest.raises(KeyError, match="not in the trace"):
        plotting.memory_timeline({"times": [0], "devices": {"cpu:0": [1]}, "sources": {},
                                  "limits": {}, "host_anon": [1], "host_file": [1],
                                  "host_rss": [1], "marks": []}, devices=["cuda:0"])


def test_snapshot_bars():
    fig = plotting.snapshot_bars(memory.snapshot())
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:4] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    assert len(ax.patches) == len(labels)


def test_transfer_summary():
    with transfers.trace() as log:
        jax.device_put(np.ones(1000, np.float32), jax.devices()[2])
    fig = plotting.transfer_summary(log)
    assert len(fig.axes) == 2
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert widths == [1, 0, 0]  # one explicit host->device
    rows = [{"direction": "host->device", "explicit": False, "count": 5, "bytes": 0,
             "unknown_size": 5}]
    fig = plotting.transfer_summary(rows, title="jit fast path")
    assert any(t.get_text() == "+ 5 of unknown size" for t in fig.axes[1].texts)


def test_style_file_ships_with_the_package():
    import os

    assert os.path.exists(plotting.STYLE) and plotting.STYLE.endswith(".mplstyle")


def test_request_vs_budget_colours_what_does_not_fit():
    fig = plotting.request_vs_budget([
        {"label": "story", "requested": 19 * 2**30, "budget": 18 * 2**30, "total": 24 * 2**30},
        {"label": "fits", "requested": 2**20, "budget": 2 * 2**20},
    ])
    story, fits = fig.axes
    assert [t.get_text() for t in story.get_yticklabels()] == [
        "requested", "budget", "device memory"]
    assert any("does not fit" in t.get_text() for t in story.texts)
    assert not any("does not fit" in t.get_text() for t in fits.texts)
    assert (story.get_xlabel(), fits.get_xlabel()) == ("GiB", "MiB")  # each on its own scale
    with pytest.raises(ValueError):
        plotting.request_vs_budget([])


def test_step_peaks_draws_three_bars_per_step():
    rows = [{"label": "chain", "xla": 48 * 2**20, "predicted": 64 * 2**20,
             "measured": 64 * 2**20},
            {"label": "mlp", "xla": 108 * 2**20, "predicted": 236 * 2**20,
             "measured": None}]  # a peak that could not be measured draws as 0
    fig = plotting.step_peaks(rows)
    (ax,) = fig.axes
    heights = sorted(round(p.get_height()) for p in ax.patches)
    assert heights == [0, 48, 64, 64, 108, 236] and ax.get_ylabel() == "MiB"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["chain", "mlp"]
    with pytest.raises(ValueError):
        plotting.step_peaks([])
