"""fa_course.attention's autograd node in C++ (python/csrc/attention_node.cpp): where it exists for
this PyTorch, an eager call that needs gradients runs through it instead of ops._Attention, a Python
autograd.Function that cost 48-134 µs more host time per forward and backward pass on an H200
(python/README.md, "The cost of a call").

It is built beside libfa_capi.so as libfa_torch_node-<torch version>.so (python/CMakeLists.txt)
and works with that PyTorch alone, so it is looked for under this PyTorch's version. It calls the
library ops.py loaded, through addresses of its functions, so one node serves every library a
process loads (torch.ops can load a namespace only once). Nothing here is built at run time: where
there is no node, ops.py runs its Python Function.
"""

import ctypes
import os
import re
import threading
from typing import Dict

import torch

from . import capi

FILE_NAME = f"libfa_torch_node-{torch.__version__}.so"

_lock = threading.Lock()
_ops = None  # torch.ops.fa_course_node once loaded
_found: Dict[str, object] = {}  # a library's path -> the node's ops, or None where it has none
_enabled = True


def use(enabled: bool) -> bool:
    """Whether eager calls may run through the C++ node (default True); False runs the Python
    autograd.Function everywhere (a benchmark's comparison, a test of both). Returns the setting
    before."""
    global _enabled
    before, _enabled = _enabled, bool(enabled)
    return before


def ops_for(library: "capi.Library"):
    """torch.ops.fa_course_node, loaded from beside `library` (or from beside the library of an earlier
    call: one node serves all); None when disabled or where no node was built for this PyTorch.
    Looked up once per library."""
    if not _enabled:
        return None
    try:
        return _found[library.path]
    except KeyError:
        pass
    global _ops
    with _lock:
        if _ops is None:
            path = os.path.join(os.path.dirname(library.path), FILE_NAME)
            if os.path.isfile(path):
                torch.ops.load_library(path)
                _ops = torch.ops.fa_course_node
        _found[library.path] = _ops
    return _ops


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def make_plan(node_ops, library: "capi.Library", problem_pointer, forward_stage: bytes, backward_stage: bytes,
              forward_workspace: int, backward_workspace: int):
    """(the node's copy of a Plan, its address): the problem, the stages (backward b"" where none runs
    the backward pass), their workspace sizes and the library's entry points. The copy is a torch
    ScriptObject that the caller keeps while it passes the address to calls."""
    handle = library.handle
    plan = node_ops.make_plan(ctypes.addressof(problem_pointer.contents), forward_stage.decode(),
                              backward_stage.decode(), forward_workspace, backward_workspace,
                              _address(handle.fa_forward_v2), _address(handle.fa_backward_v2),
                              _address(handle.fa_last_error))
    return plan, node_ops.plan_address(plan)


_FAILURE = re.compile(r"(fa_forward|fa_backward)\('([^']*)'\): status (-?\d+): ([^\n]*)")


def library_error(error: RuntimeError) -> RuntimeError:
    """The FaError that the node's message for a failed library call stands for (the error itself when
    the message is another's)."""
    found = _FAILURE.search(str(error))
    if not found:
        return error
    call, stage, status, message = found.groups()
    return capi.FaError(int(status), message.strip(), stage, call)


__all__ = ["FILE_NAME", "use", "ops_for", "make_plan", "library_error"]
