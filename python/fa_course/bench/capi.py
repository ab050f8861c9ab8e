"""The library's names as the benchmark tools import them, and the checkout they write into.

torch_runner.py imports these from `.capi`: its tokens are the torch method hash
(fa_course.bench.source_hash METHODS), which every stage's source_hash includes, so the runner
keeps them as they were measured with rather than restaling every torch row for an import line.
"""

import os

from ..capi import FA_INVALID_SHAPE, FA_UNSUPPORTED, FaError, Library, Stage  # noqa: F401

# The repository of this checkout: the benchmark tools write plots/data/<gpu>/ there.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
