"""fa_course.attention's eager calls in C++ (python/csrc/attention_node.cpp): where the node exists
for this PyTorch and this Python, an eager call runs through it: a call that needs gradients makes its
autograd node there instead of in ops._Attention, a Python autograd.Function that cost 48-134 µs
more host time per forward and backward pass on an H200, and a call without gradients allocates and
calls the library there (python/README.md, "The cost of a call").

It is built beside libfa_capi.so as libfa_torch_node-<torch version>-<Python cache tag>.so
(python/CMakeLists.txt) and works with that PyTorch and that Python alone, so it is looked for under
their names. It is a torch library (the plan class, torch.ops.fa_course_node) and a Python extension
module (the calls, `forward` and `attention`) in one file. It calls the library ops.py loaded,
through addresses of its functions, so one node serves every library a process loads (torch.ops
can load a namespace only once). Nothing here is built at run time: where there is no node, ops.py
runs its Python code.
"""

import ctypes
import importlib.util
import os
import re
import sys
import threading
from typing import Dict

import torch

from . import capi

FILE_NAME = f"libfa_torch_node-{torch.__version__}-{sys.implementation.cache_tag}.so"
MODULE_NAME = "fa_torch_node"  # its PyInit_ name (PYBIND11_MODULE in attention_node.cpp)

_lock = threading.Lock()
_module = None  # the node's extension module once loaded
_found: Dict[str, object] = {}  # a library's path -> the node's module, or None where it has none
_enabled = True


def use(enabled: bool) -> bool:
    """Whether eager calls may run through the C++ node (default True); False runs the Python
    autograd.Function everywhere (a benchmark's comparison, a test of both). Returns the setting
    before."""
    global _enabled
    before, _enabled = _enabled, bool(enabled)
    return before


def module_for(library: "capi.Library"):
    """The node's extension module, loaded from beside `library` (or from beside the library of an
    earlier call: one node serves all); None when disabled or where no node was built for this
    PyTorch and Python. Looked up once per library. Loading it registers torch.ops.fa_course_node."""
    if not _enabled:
        return None
    try:
        return _found[library.path]
    except KeyError:
        pass
    global _module
    with _lock:
        if _module is None:
            path = os.path.join(os.path.dirname(library.path), FILE_NAME)
            if os.path.isfile(path):
                spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                _module = module
        _found[library.path] = _module
    return _module


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def make_plan(library: "capi.Library", problem_pointer, forward_stage: bytes, backward_stage: bytes,
              forward_workspace: int, backward_workspace: int):
    """(the node's copy of a Plan, its address): the problem, the stages (backward b"" where none runs
    the backward pass), their workspace sizes and the library's entry points. The copy is a torch
    ScriptObject that the caller keeps while it passes the address to calls."""
    handle = library.handle
    node_ops = torch.ops.fa_course_node
    plan = node_ops.make_plan(ctypes.addressof(problem_pointer.contents), forward_stage.decode(),
                              backward_stage.decode(), forward_workspace, backward_workspace,
                              _address(handle.fa_forward_v2), _address(handle.fa_backward_v2),
                              _address(handle.fa_last_error))
    return plan, node_ops.plan_address(plan)


_FAILURE = re.compile(r"(fa_forward|fa_backward)\('([^']*)'\): status (-?\d+): ([^\n]*)")


def library_error(error) -> RuntimeError:
    """The error a failed call of the node stands for: an FaError for a failed library call, else a
    RuntimeError with the message. `error` is the message the module's calls return (a str) or a
    RuntimeError (the backward pass's, raised by autograd); a RuntimeError with another's message
    comes back as itself."""
    found = _FAILURE.search(str(error))
    if not found:
        return error if isinstance(error, RuntimeError) else RuntimeError(error)
    call, stage, status, message = found.groups()
    return capi.FaError(int(status), message.strip(), stage, call)


__all__ = ["FILE_NAME", "MODULE_NAME", "use", "module_for", "make_plan", "library_error"]
