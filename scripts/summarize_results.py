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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
