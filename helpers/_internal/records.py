"""The record base: every record the kit returns is a frozen dataclass of plain data that shows
itself in a notebook and turns into JSON in one place.

- :class:`Record`: ``to_dict()`` / ``to_json()`` / ``from_dict()`` through one codec
  (:func:`to_dict`, :func:`from_dict`): nested records become dicts, tuples become lists,
  :data:`~helpers.units.NOT_AVAILABLE` becomes ``null`` and back again where the field's type
  allows it. The child processes' requests and answers are records too, so both ends of every
  child protocol are one class.
- :class:`Display`: a record that also renders, like rich's ``JupyterMixin``. It names the module
  that renders it in ``_renderer`` (default :mod:`helpers.render`); that module registers a text
  renderer (and optionally an HTML one) with :func:`renders`. ``str(record)``, IPython's text
  view (``_repr_pretty_``) and Jupyter's HTML view (``_repr_html_``) all come from those
  renderers. The renderer module is imported by name the first time a record is shown, so
  capture modules never import their renderers and no import cycle forms.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from helpers.units import NOT_AVAILABLE, NotAvailable

__all__ = ["Display", "Record", "from_dict", "render", "renders", "to_dict", "to_json_value"]

R = TypeVar("R")


# --- the codec --------------------------------------------------------------------------------
def to_json_value(value: Any) -> Any:
    """A value as JSON-ready plain data: records -> dicts, tuples -> lists, mappings -> dicts,
    NOT_AVAILABLE -> None; everything else unchanged."""
    if value is NOT_AVAILABLE:
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, (tuple, list)):
        return [to_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_json_value(v) for k, v in value.items()}
    return value


def to_dict(record: Any) -> dict:
    """A dataclass record as a dict of plain data, fields in their declared order."""
    return {f.name: to_json_value(getattr(record, f.name)) for f in dataclasses.fields(record)}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(tp: Any, value: Any) -> Any:
    """``value`` (plain JSON data) as type ``tp``: the inverse of :func:`to_json_value`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return NOT_AVAILABLE if NotAvailable in args else None
        for arg in args:  # the first alternative that is not None / NotAvailable
            if arg not in (type(None), NotAvailable):
                return _convert(arg, value)
        return value
    if value is None:
        return None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        if args:
            return tuple(_convert(a, v) for a, v in zip(args, value, strict=True))
        return tuple(value)
    if origin is list:
        return [_convert(args[0], v) for v in value] if args else list(value)
    if origin in (Mapping, typing.Mapping):
        inner = args[1] if args else Any
        return types.MappingProxyType({k: _convert(inner, v) for k, v in value.items()})
    if origin is dict:
        inner = args[1] if args else Any
        return {k: _convert(inner, v) for k, v in value.items()}
    return value


def from_dict(cls: type[R], data: Mapping) -> R:
    """The record of class ``cls`` that :func:`to_dict` turned into ``data``. Keys the class
    does not know are ignored; a missing key takes the field's default."""
    hints = _hints(cls)
    kwargs = {f.name: _convert(hints.get(f.name, Any), data[f.name])
              for f in dataclasses.fields(cls) if f.init and f.name in data}
    return cls(**kwargs)


class Record:
    """Mixin of every record: ``to_dict`` (plain data, NOT_AVAILABLE as ``None``), ``to_json``
    and ``from_dict``, all through the one codec."""

    def to_dict(self) -> dict:
        """Plain data: what a renderer, a JSON file or another process needs."""
        return to_dict(self)

    def to_json(self, *, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls: type[R], data: Mapping) -> R:
        """The inverse of :meth:`to_dict` (for a record made in another process)."""
        return from_dict(cls, data)


# --- display ------------------------------------------------------------------------------
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


def render(record: Any, kind: str = "text") -> str | None:
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


class Display(Record):
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
