"""Figures from captured data: data in, ``matplotlib.figure.Figure`` out.

No pyplot state is touched: figures are built with ``Figure()`` under the kit's style file
(``helpers/styles/kit.mplstyle``) applied only for the duration of the call. In a notebook a
returned figure displays as PNG; elsewhere call ``fig.savefig("out.png")``.

One name for all figures: those of memory and transfers live in :mod:`helpers.plot_memory`,
those of measured results in :mod:`helpers.plot_results`.
"""

from helpers._plot_base import STYLE, bytes_axis
from helpers.plot_memory import memory_timeline, snapshot_bars, transfer_summary
from helpers.plot_results import (
    allocator_settings,
    feeding,
    load_strategies,
    pipeline_timeline,
    request_vs_budget,
    step_peaks,
)

__all__ = ["STYLE", "allocator_settings", "bytes_axis", "feeding", "load_strategies",
           "memory_timeline", "pipeline_timeline", "request_vs_budget", "snapshot_bars",
           "step_peaks", "transfer_summary"]
