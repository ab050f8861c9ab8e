#!/usr/bin/env python3
"""One half of the PyTorch op's tests (test_op.py) under pytest, as ctest runs it:

  python3 tests/torch/run.py cpu [pytest arguments]   TestCpuOp: the CPU stages, PyTorch alone
  python3 tests/torch/run.py gpu [pytest arguments]   TestGpuOp: the GPU stages, a CUDA GPU (sm_80+)
  python3 tests/torch/run.py fp8 [pytest arguments]   test_fp8.py: fa_course.fp8's checks, and stage 14
                                                      on an H100 or H200

Exit status: pytest's, except 77 (ctest's "skipped") when the half cannot run here or any of its
tests skipped, with the reason printed; with FA_REQUIRE_GPU=1 (the GPU suite) that is a failure
instead (exit 1), so a run that must test everything cannot pass by skipping.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import availability  # noqa: E402  (also puts the fa_course package on sys.path)

SKIP_EXIT_CODE = 77
# mode -> the tests it runs
TARGETS = {"cpu": "test_op.py::TestCpuOp", "gpu": "test_op.py::TestGpuOp", "fp8": "test_fp8.py"}


class Skips:
    """A pytest plugin that keeps the id and reason of every skipped test."""

    def __init__(self):
        self.skipped = []

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skipped.append(f"{report.nodeid}: {reason}")


def not_run(reason: str) -> int:
    if os.environ.get("FA_REQUIRE_GPU") == "1":
        print(f"FAILED: {reason} -- and FA_REQUIRE_GPU=1, so this is a failure, not a skip")
        return 1
    print(f"SKIPPED: {reason}")
    return SKIP_EXIT_CODE


def main(argv):
    if not argv or argv[0] not in TARGETS:
        print(f"usage: {os.path.basename(__file__)} {{{'|'.join(TARGETS)}}} [pytest arguments]", file=sys.stderr)
        return 2
    reason = availability.unavailable_reason(argv[0])
    if reason:
        return not_run(reason)
    try:
        import pytest
    except ImportError as error:
        return not_run(f"pytest is not installed in {sys.executable} ({error})")
    skips = Skips()
    target = os.path.join(HERE, TARGETS[argv[0]])
    status = pytest.main([target, "-p", "no:cacheprovider", "-rs", *argv[1:]], plugins=[skips])
    if status == 0 and skips.skipped:
        return not_run(f"{len(skips.skipped)} tests skipped:\n  " + "\n  ".join(skips.skipped))
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
