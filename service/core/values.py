"""A point's values as one spelling everywhere: how tables write them, how they sort, and when a
filter's text names one (`lr=1e-3` finds 0.001). The ledger's trial filters and the reports share it."""

from __future__ import annotations

from typing import Any


def repr_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def value_matches(value: Any, text: str) -> bool:
    """Whether a point's value is the one a filter names: as tables print it, or the same number
    (`lr=1e-3` finds 0.001)."""
    if repr_value(value) == text:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return False


def value_sort_key(s: str) -> tuple[int, float, str]:
    try:
        return (0, float(s), s)
    except ValueError:
        return (1, 0.0, s)
