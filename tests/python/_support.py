"""Shared by the tests of the fa_course package: the package on sys.path (no pip install needed) and
the built C ABI library, when there is one.

A test that needs the library is skipped, saying "no built library", when none is found; with
FA_REQUIRE_LIB=1 in the environment (ctest sets it) a missing library fails instead, so a run that
should test the library cannot skip by accident.
"""

import os
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from fa_course import capi  # noqa: E402
from fa_course.bench import results  # noqa: E402

HEADER = os.path.join(REPO, "api", "fa_capi.h")


def require_library() -> bool:
    return os.environ.get("FA_REQUIRE_LIB", "") not in ("", "0")


def library_or_skip(test: unittest.TestCase) -> capi.Library:
    """The library ($FA_CAPI_LIB, else the newest build*/lib/libfa_capi.so), or a skip that says no
    built library was found (a failure with FA_REQUIRE_LIB=1)."""
    try:
        return capi.Library()
    except capi.LibraryNotFoundError as error:
        if require_library():
            test.fail(f"FA_REQUIRE_LIB=1 but the library cannot be loaded: {error}")
        test.skipTest(f"no built library (build the fa_capi target, or set FA_CAPI_LIB): {error}")


def result_row(stage, ms, note="", **shape):
    """A forward row of a results file (results.make_row) for the data folder's tests: (B, Hq/Hkv, Nq,
    Nk, D) = (1, 32/8, 1, 4096, 128) in FP16 unless `shape` says otherwise."""
    fields = dict(stage=stage, gpu="NVIDIA H200", B=1, Hq=32, Hkv=8, Nq=1, Nk=4096, D=128, dtype="fp16", causal=0,
                  status="ok", ms_median=ms, note=note)
    fields["pass"] = "fwd"
    fields.update(shape)
    return results.make_row(**fields)
