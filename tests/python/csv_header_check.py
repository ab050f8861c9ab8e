#!/usr/bin/env python3
"""The results CSV the stage executables write (common/src/report.cpp) has exactly the columns of
fa_course.bench.schema.RESULTS_COLUMNS, and its row reads back through fa_course.bench.results.

Runs the CPU stage once at a tiny size:  01_cpu --seq 8 --dim 4 --reps 1 --warmup 0 --csv FILE
The executable: the first argument, else $FA_STAGE01_EXE, else the newest build*/bin/01_cpu; with none
the test is skipped (no built stage executable), or fails with FA_REQUIRE_LIB=1 (ctest sets it).
A ctest of its own (tests/python_tests.cmake); not collected by `unittest discover` (no test_ prefix).

  python3 tests/python/csv_header_check.py build/bin/01_cpu
"""

import glob
import os
import subprocess
import sys
import tempfile
import unittest

import _support
from fa_course.bench import results, schema

EXECUTABLE = None


def find_executable():
    if EXECUTABLE:
        return EXECUTABLE
    if os.environ.get("FA_STAGE01_EXE"):
        return os.environ["FA_STAGE01_EXE"]
    found = [p for p in glob.glob(os.path.join(_support.REPO, "build*", "bin", "01_cpu")) if os.access(p, os.X_OK)]
    return max(found, key=os.path.getmtime) if found else None


class CsvHeader(unittest.TestCase):
    def test_the_stage_executables_write_the_schema(self):
        executable = find_executable()
        if not executable or not os.access(executable, os.X_OK):
            if _support.require_library():
                self.fail(f"FA_REQUIRE_LIB=1 but there is no stage executable ({executable or 'none found'})")
            self.skipTest("no built stage executable (build the 01_cpu target, or set FA_STAGE01_EXE)")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "row.csv")
            done = subprocess.run([executable, "--seq", "8", "--dim", "4", "--reps", "1", "--warmup", "0", "--csv",
                                   path], capture_output=True, text=True, timeout=120)
            self.assertEqual(done.returncode, 0, f"{executable} failed:\n{done.stdout}\n{done.stderr}")
            with open(path) as handle:
                header = handle.readline().rstrip("\n").split(",")
            self.assertEqual(header, schema.RESULTS_COLUMNS,
                             "common/src/report.cpp's csv_header() and python/fa_course/schema.py disagree")
            rows = results.read_results(path)
        self.assertEqual(len(rows), 1)
        row = rows[0]
        self.assertEqual((row["stage"], row["B"], row["Hq"], row["Hkv"], row["Nq"], row["Nk"], row["D"], row["pass"]),
                         ("01_cpu", 1, row["Hq"], row["Hq"], 8, 8, 4, "fwd"))
        self.assertEqual(row["status"], "ok")


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        EXECUTABLE = sys.argv.pop(1)
    unittest.main()
