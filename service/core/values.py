"""A point's values as one spelling everywhere: how they are written whole (`repr_value`: labels, CSV,
filters), how a table shortens them (`params_texts`), how they sort, and when a filter's text names one
(`lr=1e-3` finds 0.001). The ledger's trial filters, the reports and the CLI's tables share it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any


def repr_value(v: Any) -> str:
    """A value written whole: a float in at most six digits where that is the number (1, 0.001, 3e-05),
    else in as many as tell it from every other float (0.00031728412345: two sampled values that agree
    in six digits were one label, one table row and one `param=` match). A table of points may shorten
    it (`params_texts`)."""
    if not isinstance(v, float):
        return str(v)
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


def params_texts(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """Points' values as a table's cells, `lr=0.00160519 seed=1`: a float in six significant digits, or
    in `repr_value`'s every digit where another value of its name in `points` agrees in those six (two
    sampled rates 3.172841e-4 and 3.172838e-4 stay two). JSON and CSV keep every digit."""
    spelt: dict[tuple[str, str], set[str]] = defaultdict(set)  # (name, six digits) → the values, every digit
    for point in points:
        for k, v in point.items():
            spelt[k, six_digits(v)].add(repr_value(v))
    return [
        " ".join(
            f"{k}={six_digits(v) if len(spelt[k, six_digits(v)]) == 1 else repr_value(v)}"
            for k, v in point.items()
        )
        for point in points
    ]


def six_digits(v: Any) -> str:
    """A float in six significant digits (`params_texts`' short form; a filter takes it for the one value
    of a study it shortens); any other value as `repr_value` writes it."""
    return f"{v:.6g}" if isinstance(v, float) else repr_value(v)


def value_matches(value: Any, text: str) -> bool:
    """Whether a point's value is the one a filter names: as `repr_value` writes it, or the same number
    (`lr=1e-3` finds 0.001). Not in `params_texts`' six digits, which two sampled values may share: the
    reads take those for the one value they shorten, or refuse naming the values that read so."""
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
