"""Kept for scripts written against it: the shared PyTorch helpers now live in the package
(python/fa_course/torch_gpu.py); these wrappers keep the old calls, which exit with status 2 and a
message instead of raising."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from fa_course import torch_gpu as _package  # noqa: E402
from fa_course.torch_gpu import event_times_ms  # noqa: E402,F401


def die(program, message):
    print(f"{program}: {message}", file=sys.stderr)
    sys.exit(2)


def load_torch(program):
    """PyTorch with a CUDA GPU, or a clear message and exit status 2."""
    try:
        return _package.load_torch()
    except _package.TorchUnavailable as error:
        die(program, str(error))


def disable_tf32(torch, program):
    try:
        _package.disable_tf32(torch)
    except _package.TorchUnavailable as error:
        die(program, str(error))
