#!/usr/bin/env python3
"""Prints a results CSV (DESIGN.md schema, read with fa_course.bench.results: older B,H,N,D files too) as a
short table: TFLOP/s per stage and shape, then causal over non-causal time where a shape has both.

  python3 scripts/summarize_results.py plots/data/NVIDIA_H200/results.csv
"""
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from fa_course.bench import results  # noqa: E402
from fa_course import Problem  # noqa: E402


def shape_label(row):
    """BxHxNxD for a square problem, BxHq/HkvxNq/NkxD otherwise; ' bwd' (or ' fwd+bwd') for a backward row."""
    problem = Problem.from_row(row)
    heads = f"{problem.q_heads}" if not problem.grouped else f"{problem.q_heads}/{problem.kv_heads}"
    seqs = f"{problem.q_seq}" if not problem.rectangular else f"{problem.q_seq}/{problem.kv_seq}"
    label = f"{problem.batch}x{heads}x{seqs}x{problem.dim}"
    return label if row["pass"] == "fwd" else f"{label} {row['pass']}"


def column(row):
    """A table column per stage, and per precision where a stage has more than one."""
    return row["stage"], row["dtype"]


def main(path: str) -> int:
    try:
        rows = results.read_results(path)
    except (OSError, results.SchemaError) as error:
        print(f"summarize_results: {error}", file=sys.stderr)
        return 2
    shapes = OrderedDict()
    columns = OrderedDict()
    cells = {}
    for row in rows:
        shape = shape_label(row) + ("c" if row["causal"] else "")
        shapes[shape] = None
        columns[column(row)] = None
        value = f"{row['tflops']:.2f}" if row["status"] == "ok" and row["tflops"] is not None else row["status"]
        cells[(column(row), shape)] = value
    stages_with_dtypes = {}
    for stage, dtype in columns:
        stages_with_dtypes.setdefault(stage, set()).add(dtype)
    names = {key: key[0] if len(stages_with_dtypes[key[0]]) == 1 else f"{key[0]}/{key[1]}" for key in columns}
    width = max([len(n) for n in names.values()] + [10])
    title_width = max([len(s) for s in shapes] + [24]) + 1
    print("TFLOP/s by shape (BxHxNxD)".ljust(title_width) + "".join(names[c].rjust(width + 1) for c in columns))
    for shape in shapes:
        print(shape.ljust(title_width) + "".join(cells.get((c, shape), "-").rjust(width + 1) for c in columns))
    print_causal_ratios(rows, list(columns), names, width, title_width)
    return 0


def print_causal_ratios(rows, columns, names, width, title_width):
    """Causal median time over non-causal median time, where a shape has both (the skip pays when < 0.6)."""
    times = {}
    for row in rows:
        if row["status"] == "ok" and row["ms_median"] is not None:
            times[(column(row), shape_label(row), bool(row["causal"]))] = row["ms_median"]
    shapes = list(OrderedDict.fromkeys(shape for (_, shape, causal) in times if causal))
    if not shapes:
        return
    print("causal / non-causal time".ljust(title_width) + "".join(names[c].rjust(width + 1) for c in columns))
    for shape in shapes:
        cells = []
        for key in columns:
            full, masked = times.get((key, shape, False)), times.get((key, shape, True))
            cells.append(f"{masked / full:.2f}" if full and masked else "-")
        print(shape.ljust(title_width) + "".join(c.rjust(width + 1) for c in cells))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: summarize_results.py RESULTS_CSV", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
