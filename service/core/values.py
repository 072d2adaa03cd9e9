"""A point's values as one spelling everywhere: how tables write them, how they sort, and when a
filter's text names one (`lr=1e-3` finds 0.001). The ledger's trial filters and the reports share it."""

from __future__ import annotations

from typing import Any


def repr_value(v: Any) -> str:
    """A value as tables print it: a float in at most six digits where that is the number (1, 0.001,
    3e-05), else in as many as tell it from every other float (0.00031728412345: two sampled values
    that agree in six digits were one label, one table row and one `param=` match)."""
    if not isinstance(v, float):
        return str(v)
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


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
