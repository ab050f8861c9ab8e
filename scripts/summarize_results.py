#!/usr/bin/env python3
"""Prints a results CSV (design.md schema) as a short table: TFLOP/s per stage and shape."""
import csv
import sys
from collections import OrderedDict


def main(path: str) -> int:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    shapes = OrderedDict()
    stages = OrderedDict()
    cells = {}
    for row in rows:
        shape = f"{row['B']}x{row['H']}x{row['N']}x{row['D']}" + ("c" if row["causal"] == "1" else "")
        shapes[shape] = None
        stages[row["stage"]] = None
        value = f"{float(row['tflops']):.2f}" if row["status"] == "ok" else row["status"]
        cells[(row["stage"], shape)] = value
    width = max([len(s) for s in stages] + [10])
    print("TFLOP/s by shape (BxHxNxD)".ljust(24) + "".join(s.rjust(width + 1) for s in stages))
    for shape in shapes:
        print(shape.ljust(24) + "".join(cells.get((s, shape), "-").rjust(width + 1) for s in stages))
    print_causal_ratios(rows, list(stages), width)
    return 0


def print_causal_ratios(rows, stages, width):
    """Causal median time over non-causal median time, where a shape has both (the skip pays when < 0.6)."""
    times = {}
    for row in rows:
        if row["status"] == "ok":
            shape = f"{row['B']}x{row['H']}x{row['N']}x{row['D']}"
            times[(row["stage"], shape, row["causal"] == "1")] = float(row["ms_median"])
    shapes = list(OrderedDict.fromkeys(shape for (_, shape, causal) in times if causal))
    if not shapes:
        return
    print("causal / non-causal time".ljust(24) + "".join(s.rjust(width + 1) for s in stages))
    for shape in shapes:
        cells = []
        for stage in stages:
            full, masked = times.get((stage, shape, False)), times.get((stage, shape, True))
            cells.append(f"{masked / full:.2f}" if full and masked else "-")
        print(shape.ljust(24) + "".join(c.rjust(width + 1) for c in cells))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
