"""Where cuobjdump is: CUDA's disassembler, for the SASS that scripts/restamp compares and the
structural tests read (tests/sass_listing.py). Standard library only."""

import glob
import os
import shutil
import sys


def find_cuobjdump(root, ptxas=None):
    """The path of an executable cuobjdump, or None: $FA_CUOBJDUMP, PATH, the toolkit beside `ptxas`
    or in /usr/local/cuda, then PyPI's nvidia-cuda-cuobjdump, which puts it in
    site-packages/nvidia/cu<major>/bin (this Python's, or the course's .venv under `root`, made by
    scripts/lib/setup.sh from requirements.txt)."""
    candidates = [os.environ.get("FA_CUOBJDUMP", ""), shutil.which("cuobjdump") or ""]
    if ptxas:
        candidates.append(os.path.join(os.path.dirname(ptxas), "cuobjdump"))
    candidates.append("/usr/local/cuda/bin/cuobjdump")
    for base in sys.path + glob.glob(os.path.join(root, ".venv", "lib", "python*", "site-packages")):
        candidates += sorted(glob.glob(os.path.join(base, "nvidia", "*", "bin", "cuobjdump")))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
