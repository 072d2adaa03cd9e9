"""Tables as CSV — a study's trials, its success counts, a comparison of studies — with what their
numbers were judged under in leading comment lines:

    # table: success
    # study: 3f9c2a1b7d4e (demo-copy50)
    # criterion: 0.5 × baseline
    # trainer_version: 4
    "table","model","field","value","trials","finished","failed","raised","pruned","errors","succeeded","rate","ci95_low","ci95_high"
    "by_model","chain","","",4,4,0,0,0,0,4,1.0,0.5101,1.0

Columns are the JSON answer's field names: a nested object's fields as `name.field` (`params.lr`,
`config.task_params.seq_len`, `group.cell`), an interval [low, high] as `name_low` and `name_high`
(`ci95_low`, `difference_ci95_high`), any other list as JSON text. The success table's rows carry the
JSON member they come from (`table`: total, by_model or by_value) and its keys (`model`, `field`,
`value`); what the counts cannot say themselves (the JSON's `notes`: a count taken at each run's end)
is a `# notes:` line, as it holds for the whole table, not a column repeated on every row. Every text
field is quoted, so a `#` inside one is data; read a table with pandas as

    frame = pd.read_csv(path_or_url, comment="#")      # or service.reports.tables.read_csv: the header in .attrs

The REST routes answer these for `Accept: text/csv` or `?format=csv`; the CLI prints them with `--csv`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from service.reports.summary import SuccessCell
from trainers import TRAINER_VERSION

if TYPE_CHECKING:
    import pandas as pd

MEDIA_TYPE = "text/csv"
#: fields that are an interval [low, high]: two columns, `name_low` and `name_high`
INTERVALS = ("ci95", "difference_ci95", "wall_seconds_range", "trial_hours_range")
#: the success table's cell fields, in order: `SuccessCell`'s own, so that a field added there is a column
#: of the CSV and of the client's frame too
CELL_FIELDS = tuple(SuccessCell.model_fields)
#: the same as columns, an interval as its `_low` and `_high`: the client's frame's (`csv_cells` names a
#: CSV's alike)
CELL_COLUMNS = tuple(
    column
    for field in CELL_FIELDS
    for column in ((f"{field}_low", f"{field}_high") if field in INTERVALS else (field,))
)


def wants_csv(format: str | None, accept: str | None) -> bool:
    """Whether a request asks for CSV: `?format=csv`, or an Accept header that names text/csv
    (`?format=json` wins over the header)."""
    if format is not None:
        return format == "csv"
    return accept is not None and MEDIA_TYPE in accept.lower()


def csv_cells(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """One JSON object as CSV cells: nested objects as dotted names, intervals as _low/_high, other
    lists as JSON text. A rate of no finished run is empty, and so is its `ci95` (the JSON's [0, 1],
    Wilson's interval of 0/0, read in a CSV as an estimate)."""
    unestimated = "rate" in record and record["rate"] is None
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(csv_cells(value, f"{name}."))
        elif key in INTERVALS and (value is None or (key == "ci95" and unestimated)):
            out[f"{name}_low"] = out[f"{name}_high"] = None
        elif key in INTERVALS and isinstance(value, (list, tuple)) and len(value) == 2:
            out[f"{name}_low"], out[f"{name}_high"] = value
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def to_csv(rows: Iterable[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """Rows (JSON objects) as CSV text under `# key: value` lines; the columns of every row (a field one
    row lacks is an empty cell) in `column_order`."""
    flat = [csv_cells(r) for r in rows]
    columns = column_order(flat)
    buf = io.StringIO()
    for key, value in {**meta, "trainer_version": TRAINER_VERSION}.items():
        text = "" if value is None else str(value)
        buf.write(f"# {key}: {' '.join(text.split())}\n")  # one line each
    writer = csv.writer(buf, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
    writer.writerow(list(columns))
    for r in flat:
        writer.writerow(["" if r.get(c) is None else r[c] for c in columns])
    return buf.getvalue()


def column_order(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every row's columns, each where it first appears, but a nested field beside its object's others: a
    trial of an added cell brings `params.leak` and `config.cell_params.leak`, which went after every
    column of the rows before it (the `config.*`), not beside `params.lr` and `config.cell_params.*`."""
    columns: list[str] = []
    seen: set[str] = set()
    for row in rows:
        for name in row:
            if name in seen:
                continue
            seen.add(name)
            at = len(columns)
            parts = name.split(".")
            for depth in range(len(parts) - 1, 0, -1):  # the deepest object it shares with a column so far
                parent = ".".join(parts[:depth])  # (a row where it was null has it as one column)
                kin = [i for i, c in enumerate(columns) if c == parent or c.startswith(f"{parent}.")]
                if kin:
                    at = kin[-1] + 1
                    break
            columns.insert(at, name)
    return columns


def read_csv(source: Any) -> pd.DataFrame:
    """A memsweep CSV (a path, a URL's text as io.StringIO, or a file) as a DataFrame; its header
    lines (`table`, `criterion`, `trainer_version`, …) in `frame.attrs`."""
    import pandas as pd

    text = source.read() if hasattr(source, "read") else open(source, encoding="utf-8").read()  # noqa: SIM115
    meta = {}
    for line in text.splitlines():
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(": ")
        meta[key] = value
    frame = pd.read_csv(io.StringIO(text), comment="#")
    frame.attrs.update(meta)
    return frame


# ----- the tables ----------------------------------------------------------------------------------


def trials_csv(page: Mapping[str, Any], study: str) -> str:
    """A page of `GET /studies/{id}/trials` (its `items`, every field of each trial)."""
    items: Sequence[Mapping[str, Any]] = page["items"]
    meta = {
        "table": "trials",
        "study": study,
        "criterion": page["criterion"]["name"],
        "rows": f"{len(items)} of {page['total']} (offset {page['offset']}; ?offset= and ?limit= page on)",
    }
    return to_csv(items, meta)


def success_rows(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A success table's cells as rows: the total, then by model, then by (model, field, value)."""
    rows = [_success_row("total", table["total"])]
    rows += [_success_row("by_model", cell, model) for model, cell in table["by_model"].items()]
    differences = table.get("differences")
    if differences:  # each model's rate minus the reference model's (`?reference=`)
        for row in rows:
            d = differences.get(row["model"]) if row["table"] == "by_model" else None
            row["difference"] = None if d is None else d["difference"]
            row["difference_ci95"] = None if d is None else d["ci95"]
            row["difference_p"] = None if d is None else d.get("p")
            row["is_reference"] = None if d is None else row["model"] == table["reference"]
    rows += [
        _success_row("by_value", cell, model, field, value)
        for model, fields in table["by_value"].items()
        for field, values in fields.items()
        for value, cell in values.items()
    ]
    return rows


def _success_row(
    which: str,
    cell: Mapping[str, Any],
    model: str | None = None,
    field: str | None = None,
    value: str | None = None,
) -> dict[str, Any]:
    return {
        "table": which,
        "model": model,
        "field": field,
        "value": value,
        **{k: cell[k] for k in CELL_FIELDS},
    }


def success_csv(table: Mapping[str, Any], study: str) -> str:
    """`GET /studies/{id}/success` as rows (see `success_rows`); its notes, when it has any, on one
    header line."""
    meta = {"table": "success", "study": study, "criterion": table["criterion"]["name"]}
    meta["at_step"] = table.get("at_step") or "each run's end"
    if table.get("notes"):
        meta["notes"] = "; ".join(table["notes"])
    if table.get("reference"):
        meta["reference"] = (
            f"{table['reference']} (difference: each model's rate minus its, Newcombe's 95 % interval)"
        )
    return to_csv(success_rows(table), meta)


def comparison_csv(comparison: Mapping[str, Any]) -> str:
    """`GET /compare`'s rows; the header names each study's criterion."""
    criteria = "; ".join(f"{s['study_id']} {s['criterion']['name']}" for s in comparison["studies"])
    meta = {
        "table": "comparison",
        "studies": ", ".join(f"{s['study_id']} ({s['name']})" for s in comparison["studies"]),
        "criterion": criteria,
        "by": ",".join(comparison["by"]),
        "at_step": comparison.get("at_step") or "each run's end",
        "difference": f"rate − the rate of {comparison['reference']}, 95 % Newcombe hybrid score interval",
    }
    return to_csv(comparison["rows"], meta)
