"""One display mixin for every record the kit returns, like rich's ``JupyterMixin``.

A record (a frozen dataclass of plain data) inherits :class:`Display` and names the module that
renders it in ``_renderer``. That module registers a text renderer (and optionally an HTML one)
with :func:`renders`. ``str(record)``, IPython's text view (``_repr_pretty_``) and Jupyter's
HTML view (``_repr_html_``) all come from those renderers. The renderer module is imported by
name the first time a record is shown, so data modules never import their renderers: capture
and rendering stay apart and no import cycle forms.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import ClassVar

__all__ = ["Display", "render", "renders"]

_TEXT: dict[str, Callable] = {}
_HTML: dict[str, Callable] = {}


def _key(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def renders(record: str | type, *, text: Callable, html: Callable | None = None) -> None:
    """Register the renderers of a record class, named "module.Class" (so the renderer module
    need not import the record's module, nor what that imports, JAX included)."""
    key = record if isinstance(record, str) else _key(record)
    _TEXT[key] = text
    if html is not None:
        _HTML[key] = html


def _find(table: dict, cls: type) -> Callable | None:
    for klass in cls.__mro__:
        if _key(klass) in table:
            return table[_key(klass)]
    return None


def render(record, kind: str = "text") -> str | None:
    """The record rendered as "text" or "html" (None: no HTML renderer registered)."""
    table = _TEXT if kind == "text" else _HTML
    cls = type(record)
    fn = _find(table, cls)
    if fn is None and _find(_TEXT, cls) is None:
        importlib.import_module(cls._renderer)  # registers on import
        fn = _find(table, cls)
    if fn is None and kind == "text":
        raise TypeError(f"no text renderer registered for {cls.__name__} in {cls._renderer}")
    return None if fn is None else fn(record)


class Display:
    """Mixin: ``__str__``, ``_repr_pretty_`` and ``_repr_html_`` from the registered renderers."""

    _renderer: ClassVar[str] = "helpers.render"

    def __init_subclass__(cls, **kwargs):
        # IPython's pretty printer walks the MRO and stops at the first class that defines
        # __repr__ (every dataclass does): the hook must sit in each record's own class.
        super().__init_subclass__(**kwargs)
        cls._repr_pretty_ = Display._repr_pretty_

    def __str__(self) -> str:
        return render(self, "text")

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython's text/plain view
        printer.text(f"{type(self).__name__}(...)" if cycle else str(self))

    def _repr_html_(self) -> str | None:  # Jupyter's text/html view; None: text only
        return render(self, "html")
