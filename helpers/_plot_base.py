"""What every figure shares: the style file, a pyplot-free Figure, and a bytes axis."""

from __future__ import annotations

from importlib import resources

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

__all__ = ["STYLE", "bytes_axis"]

STYLE = str(resources.files("helpers") / "styles" / "kit.mplstyle")
_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _unit_for(max_bytes: float) -> tuple[int, str]:
    for factor, name in _UNITS:
        if max_bytes >= factor:
            return factor, name
    return 1, "B"


def bytes_axis(axis, max_bytes: float) -> tuple[int, str]:
    """Pick one binary unit from the data; plot values divided by the returned factor and the
    axis gets round ticks in that unit. Returns (factor, unit name)."""
    factor, name = _unit_for(max_bytes)
    axis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    return factor, name


def _scaled(values, factor):
    return [None if v is None else v / factor for v in values]


def _figure(**kwargs) -> Figure:
    """A pyplot-free Figure; callers hold ``matplotlib.style.context(STYLE)`` around it."""
    fig = Figure(**kwargs)
    fig.set_layout_engine("constrained")
    return fig
