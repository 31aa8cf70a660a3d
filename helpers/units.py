"""The kit's vocabulary for numbers: bytes <-> human sizes ("1.5 GiB", binary units by default),
and the one "not available" value.

A CPU device keeps no allocator statistics (``memory_stats()`` is ``None``), a backend has no
peak counter, a platform has no anonymous/file-backed split: the kit's records say so with
:data:`NOT_AVAILABLE` rather than ``None`` or ``0``. It is an enum member, so type checkers see
``int | NotAvailable``; it is falsy, renders as "not available" (also in :func:`format_bytes`),
and becomes ``null`` in JSON.

>>> format_bytes(20_498_743_674)
'19.09 GiB'
>>> parse_size("1.5 GiB")
1610612736
>>> bool(NOT_AVAILABLE), str(NOT_AVAILABLE), format_bytes(NOT_AVAILABLE)
(False, 'not available', 'not available')
>>> or_not_available(None) is NOT_AVAILABLE
True
"""

from __future__ import annotations

import enum
import math
import re
from typing import TypeVar

from helpers.errors import SizeError

__all__ = ["NOT_AVAILABLE", "NotAvailable", "format_bytes", "or_not_available", "parse_size"]

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


_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_FACTORS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4, "pi": 1024**5, "pib": 1024**5,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def format_bytes(n: int | float | NotAvailable | None, *, precision: int = 2) -> str:
    """Format a byte count with binary units: 1536 -> '1.50 KiB'. NOT_AVAILABLE (or None) ->
    'not available', the one spelling of a number nobody measured."""
    if n is None or isinstance(n, NotAvailable):
        return str(NOT_AVAILABLE)
    if isinstance(n, float) and not math.isfinite(n):
        raise SizeError(f"cannot format {n!r} as bytes")
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    unit = 0
    while value >= 1024 and unit < len(_BINARY) - 1:
        value /= 1024
        unit += 1
    return f"{sign}{value:.{precision}f} {_BINARY[unit]}"


def parse_size(text: str | int, *, allow_zero: bool = False) -> int:
    """Parse '1.5 GiB', '512MiB', '2e9', '10 GB' or an int into bytes.

    Units: B; KiB/MiB/GiB/TiB/PiB (powers of 1024); KB/MB/GB/TB/PB (powers of 1000);
    case-insensitive. Raises SizeError naming the input and the accepted forms.
    """
    if isinstance(text, bool):
        raise SizeError(f"size must be a number of bytes or a string like '1.5 GiB', got {text!r}")
    if isinstance(text, int):
        n = text
    elif isinstance(text, str):
        match = _SIZE_RE.match(text)
        if not match:
            raise SizeError(
                f"cannot read {text!r} as a size; write a number with an optional unit, "
                "e.g. '1.5 GiB', '512 MiB', '2 GB' or '1048576'"
            )
        number, unit = match.groups()
        factor = _FACTORS.get(unit.lower())
        if factor is None:
            raise SizeError(
                f"unknown unit {unit!r} in {text!r}; use B, KiB, MiB, GiB, TiB "
                "(powers of 1024) or KB, MB, GB, TB (powers of 1000)"
            )
        n = int(round(float(number) * factor))
    else:
        raise SizeError(
            f"size must be a number of bytes or a string like '1.5 GiB', got {type(text).__name__}"
        )
    if n < 0 or (n == 0 and not allow_zero):
        raise SizeError(f"size must be greater than zero, got {text!r}")
    return n
