"""Reading and writing the CSV files of DESIGN.md ("Results CSV") with the columns of schema.py; no
pandas needed (pandas.DataFrame(read_results(path)) gives a frame).

    from fa_course.bench import results
    rows = results.read_results("plots/data/NVIDIA_H200/torch.csv")   # list of dicts
    rows[0]["Hq"], rows[0]["pass"], rows[0]["tflops"]                    # 16, 'fwd', 285.342
    results.merge_results(path, new_rows)   # replaces rows with the same key, adds the others
    results.write_results(path, rows)       # writes exactly these rows (the file is replaced)

Rows are dicts keyed by the column names. Read rows are typed: the shape columns, causal (0 or 1)
and peak_bytes are int, the timings and errors float, an empty field None, the rest str. Written
rows may hold numbers, bools or strings; a float is written with 6 significant digits unless the
row already holds it as text.

Files written before the second part of the course (B, H, N, D, no pass) are converted on read: H
becomes Hq = Hkv, N becomes Nq = Nk, pass is fwd; traffic files of that time likewise (causal 0).
A file holding one key twice is an error (SchemaError), and so is a header of no known kind.
"""

from __future__ import annotations

import csv
import io
import math
import os
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import schema

PathLike = Union[str, "os.PathLike[str]"]

INT_COLUMNS = {"B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "peak_bytes", "H", "N", "dram_read_bytes",
               "dram_write_bytes", "l2_bytes", "predicted_bytes"}
FLOAT_COLUMNS = {"ms_median", "ms_min", "tflops", "gbps", "max_abs_err", "rel_l2_err", "value"}

# The kinds of file, by header. Legacy kinds are read (converted), never written.
LEGACY_TRAFFIC_COLUMNS = ["stage", "gpu", "B", "H", "N", "D", "dtype", "dram_read_bytes", "dram_write_bytes",
                          "l2_bytes", "predicted_bytes"]
KINDS = {
    "results": (schema.RESULTS_COLUMNS, schema.RESULTS_KEY),
    "ceilings": (schema.CEILINGS_COLUMNS, schema.CEILINGS_KEY),
    "traffic": (schema.TRAFFIC_COLUMNS, schema.TRAFFIC_KEY),
}
LEGACY_KINDS = {
    "results": schema.LEGACY_RESULTS_COLUMNS,
    "traffic": LEGACY_TRAFFIC_COLUMNS,
}


class SchemaError(ValueError):
    """A file or row that does not fit DESIGN.md's schema (unknown header or column, duplicate key)."""


# ---- kinds and conversion ------------------------------------------------------------------------


def read_header(path: PathLike) -> List[str]:
    with open(path, newline="") as handle:
        return [name.strip() for name in next(csv.reader(handle), [])]


def header_kind(header: Sequence[str]) -> Tuple[Optional[str], bool]:
    """(kind, legacy) of a header: kind is 'results', 'ceilings', 'traffic' or None."""
    header = [h.strip() for h in header]
    for kind, (columns, _) in KINDS.items():
        if header == columns:
            return kind, False
    for kind, columns in LEGACY_KINDS.items():
        if header == columns:
            return kind, True
    return None, False


def csv_kind(path: PathLike) -> Optional[str]:
    """'results', 'ceilings', 'traffic' (legacy headers included) or None for any other file."""
    return header_kind(read_header(path))[0]


def convert_legacy(row: Dict[str, str]) -> Dict[str, str]:
    """A row of a B, H, N, D file as a row of the current schema: Hq = Hkv = H, Nq = Nk = N, pass fwd
    (and causal 0 when the file had no causal column)."""
    converted = {}
    for name, value in row.items():
        if name == "H":
            converted["Hq"] = converted["Hkv"] = value
        elif name == "N":
            converted["Nq"] = converted["Nk"] = value
        else:
            converted[name] = value
    converted.setdefault("causal", "0")
    converted.setdefault("pass", "fwd")
    return converted


def _typed(name: str, text: Optional[str]):
    if text is None:
        return None
    text = text.strip()
    if text == "":
        return None
    if name in INT_COLUMNS:
        try:
            return int(text)
        except ValueError:
            return int(float(text))  # "1e+09" from a %g writer
    if name in FLOAT_COLUMNS:
        return float(text)
    return text


def key_of(row: Dict, key: Sequence[str] = schema.RESULTS_KEY) -> tuple:
    """The row's key as a tuple of normalized values (1 and '1' are the same key)."""
    values = []
    for name in key:
        value = row.get(name)
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, str) and name in INT_COLUMNS and value.strip():
            value = _typed(name, value)
        values.append(value)
    return tuple(values)


# ---- reading -------------------------------------------------------------------------------------


def read_csv(path: PathLike, kind: Optional[str] = None, duplicates: str = "error",
             typed: bool = True) -> Tuple[str, List[Dict]]:
    """(kind, rows) of a CSV file of any known kind, legacy files converted to the current columns.
    `kind` (when given) must match. `duplicates`: 'error' (the default, DESIGN.md: readers fail
    loudly) or 'last' (a later row replaces an earlier one with its key, in the earlier one's place).
    `typed`: convert values (see the module docstring); else every value is a str."""
    if duplicates not in ("error", "last"):
        raise ValueError("duplicates must be 'error' or 'last'")
    with open(path, newline="") as handle:
        text = handle.read()
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    header = [h.strip() for h in next(reader, [])]
    if not header:
        if kind is None:
            raise SchemaError(f"{path} is empty: no header")
        return kind, []
    found, legacy = header_kind(header)
    if found is None or (kind is not None and found != kind):
        wanted = ", ".join(KINDS[kind][0]) if kind else " | ".join(", ".join(c) for c, _ in KINDS.values())
        raise SchemaError(f"{path}: the header {', '.join(header)} is not {'a ' + kind if kind else 'a known'} "
                          f"header (expected {wanted})")
    columns, key = KINDS[found]
    rows: List[Dict] = []
    where: Dict[tuple, int] = {}
    for line_number, values in enumerate(reader, start=2):
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise SchemaError(f"{path}:{line_number}: {len(values)} fields, the header has {len(header)}")
        row = dict(zip(header, values))
        if legacy:
            row = convert_legacy(row)
        row = {name: (_typed(name, row.get(name)) if typed else (row.get(name) or "")) for name in columns}
        row_key = key_of(row, key)
        if row_key in where:
            if duplicates == "error":
                raise SchemaError(f"{path}:{line_number}: the key {dict(zip(key, row_key))} appears twice "
                                  f"(DESIGN.md: one row per key; merge_results replaces rows instead of adding)")
            rows[where[row_key]] = row
            continue
        where[row_key] = len(rows)
        rows.append(row)
    return found, rows


def read_results(path: Union[PathLike, Iterable[PathLike]], duplicates: str = "error", typed: bool = True) -> List[Dict]:
    """The rows of one results CSV, or of several (in order; a key in two files is a duplicate too)."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    rows: List[Dict] = []
    where: Dict[tuple, int] = {}
    for one in paths:
        for row in read_csv(one, "results", duplicates, typed)[1]:
            row_key = key_of(row)
            if row_key in where:
                if duplicates == "error":
                    raise SchemaError(f"{one}: the key {dict(zip(schema.RESULTS_KEY, row_key))} is also in an "
                                      f"earlier file ({', '.join(map(str, paths))})")
                rows[where[row_key]] = row
                continue
            where[row_key] = len(rows)
            rows.append(row)
    return rows


def read_traffic(path: PathLike, duplicates: str = "error", typed: bool = True) -> List[Dict]:
    return read_csv(path, "traffic", duplicates, typed)[1]


def read_ceilings(path: PathLike, duplicates: str = "error", typed: bool = True) -> List[Dict]:
    return read_csv(path, "ceilings", duplicates, typed)[1]


# ---- writing -------------------------------------------------------------------------------------


def format_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.6g}"
    return str(value)


def make_row(kind: str = "results", **fields) -> Dict:
    """A row with every column of the kind (empty where not given); SchemaError for a column the kind
    does not have."""
    columns = KINDS[kind][0]
    unknown = [name for name in fields if name not in columns]
    if unknown:
        raise SchemaError(f"no column {', '.join(unknown)} in the {kind} schema ({', '.join(columns)})")
    return {name: fields.get(name) for name in columns}


def _checked(rows: Iterable[Dict], kind: str) -> List[Dict]:
    columns, key = KINDS[kind]
    checked = []
    for row in rows:
        unknown = [name for name in row if name not in columns]
        if unknown:
            raise SchemaError(f"no column {', '.join(unknown)} in the {kind} schema ({', '.join(columns)})")
        missing = [name for name in key if row.get(name) in (None, "")]
        if missing:
            raise SchemaError(f"a {kind} row without {', '.join(missing)}: {row}")
        if kind == "results":
            if row.get("pass") not in schema.PASSES:
                raise SchemaError(f"pass must be one of {', '.join(schema.PASSES)}, not {row.get('pass')!r}")
            status = row.get("status")
            if status not in (None, "") and status not in schema.STATUSES:
                raise SchemaError(f"status must be one of {', '.join(schema.STATUSES)}, not {status!r}")
        checked.append(row)
    return checked


def write_csv(path: PathLike, rows: Iterable[Dict], kind: str = "results") -> None:
    """Writes exactly `rows` under the kind's header, replacing the file (atomically: a reader never
    sees half a file). Fails on a duplicate key."""
    columns, key = KINDS[kind]
    rows = _checked(rows, kind)
    seen = set()
    for row in rows:
        row_key = key_of(row, key)
        if row_key in seen:
            raise SchemaError(f"two rows with the key {dict(zip(key, row_key))}")
        seen.add(row_key)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=".tmp_", suffix=".csv", dir=folder)
    try:
        with os.fdopen(descriptor, "w", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(columns)
            for row in rows:
                writer.writerow([format_value(row.get(name)) for name in columns])
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def merge_csv(path: PathLike, rows: Iterable[Dict], kind: str = "results") -> Tuple[int, int]:
    """Adds `rows` to the file (created when missing): a row whose key is already there replaces that
    row in place, the others are appended (DESIGN.md: a partial run replaces the rows with the same
    key). An older-header file is rewritten in the current schema. Returns (replaced, added)."""
    columns, key = KINDS[kind]
    new_rows = _checked(rows, kind)
    existing: List[Dict] = []
    if os.path.exists(path) and os.path.getsize(path) > 0:
        existing = read_csv(path, kind, duplicates="error", typed=False)[1]
    where = {key_of(row, key): index for index, row in enumerate(existing)}
    replaced = added = 0
    for row in new_rows:
        row_key = key_of(row, key)
        if row_key in where:
            existing[where[row_key]] = row
            replaced += 1
        else:
            where[row_key] = len(existing)
            existing.append(row)
            added += 1
    write_csv(path, existing, kind)
    return replaced, added


def write_results(path: PathLike, rows: Iterable[Dict]) -> None:
    write_csv(path, rows, "results")


def merge_results(path: PathLike, rows: Iterable[Dict]) -> Tuple[int, int]:
    return merge_csv(path, rows, "results")


def write_traffic(path: PathLike, rows: Iterable[Dict]) -> None:
    write_csv(path, rows, "traffic")


def write_ceilings(path: PathLike, rows: Iterable[Dict]) -> None:
    write_csv(path, rows, "ceilings")


def gpu_folder(gpu: str) -> str:
    """The folder name of a GPU's data set: plots/data/<this>/ (spaces as _)."""
    return gpu.replace(" ", "_")
