"""The one "not available" value: a number a backend or the OS does not keep.

A CPU device keeps no allocator statistics (``memory_stats()`` is ``None``), a backend has no
peak counter, a platform has no anonymous/file-backed split: the kit's records say so with
:data:`NOT_AVAILABLE` rather than ``None`` or ``0``. It is an enum member, so type checkers see
``int | NotAvailable``; it is falsy, renders as "not available", and becomes ``null`` in JSON
(:func:`to_json_value`).

>>> bool(NOT_AVAILABLE), str(NOT_AVAILABLE)
(False, 'not available')
>>> or_not_available(None) is NOT_AVAILABLE
True
"""

from __future__ import annotations

import enum
from typing import TypeVar

__all__ = ["NOT_AVAILABLE", "NotAvailable", "or_not_available", "to_json_value"]

T = TypeVar("T")


class NotAvailable(enum.Enum):
    """Type of :data:`NOT_AVAILABLE` (a one-member enum: the typed sentinel idiom, PEP 484)."""

    NOT_AVAILABLE = "not available"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NOT_AVAILABLE"

    def __str__(self) -> str:
        return "not available"


NOT_AVAILABLE = NotAvailable.NOT_AVAILABLE


def or_not_available(value: T | None) -> T | NotAvailable:
    """``value``, or NOT_AVAILABLE where it is None."""
    return NOT_AVAILABLE if value is None else value


def to_json_value(value):
    """NOT_AVAILABLE -> None (JSON null); everything else unchanged."""
    return None if value is NOT_AVAILABLE else value
