"""pytest's set-up for the PyTorch op's tests: the fa_course package on sys.path (no pip install
needed). tests/torch/run.py is how ctest runs them; `python3 -m pytest tests/torch` works too."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
