"""The course's stages through their C ABI (api/fa_capi.h), loaded with ctypes: nothing here
builds against CUDA or PyTorch.

    import fa_course
    lib = fa_course.Library()              # the library installed with the package
    lib = fa_course.Library("build/lib/libfa_capi.so")   # a development build, named explicitly
    for stage in lib.stages():
        print(stage.id, stage.precision, sorted(stage.features), stage.kv_passes)
    problem = fa_course.Problem(1, 4, 2, 16, 40, 8, causal=True)
    lib.forward("01_cpu", problem, q, k, v, o, lse=lse)   # raises FaError on any failure

Which library loads is explicit: the path given, else $FA_CAPI_LIB, else the one `pip install`
built into the package (fa_course/libfa_capi.so); never a build folder found by searching.

Tensors are addresses: an int, None, or anything with one (a PyTorch tensor's data_ptr(), a NumPy
array, an array.array, a ctypes object). The library does not know their sizes: the caller passes
contiguous buffers of the stage's precision and the problem's shapes (fa_course.attention checks
PyTorch tensors before calling). CUDA stages take device pointers and run on `stream` (None: the
legacy default stream; a PyTorch stream or its .cuda_stream); the CPU stage takes host pointers
and returns when O is written.

A library built before version 2 of the ABI (no fa_abi_version) still loads: its stages run the
square (B, H, N, D) forward pass and report the causal feature only.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from typing import Dict, FrozenSet, List, Optional

from .problem import Problem

# ---- enums of fa_capi.h --------------------------------------------------------------------------

FA_OK = 0
FA_UNKNOWN_STAGE = 1
FA_INVALID_SHAPE = 2
FA_UNSUPPORTED = 3
FA_CUDA_ERROR = 4
FA_INVALID_ARGUMENT = 5
FA_INTERNAL_ERROR = 6
STATUS_NAMES = {FA_OK: "FA_OK", FA_UNKNOWN_STAGE: "FA_UNKNOWN_STAGE", FA_INVALID_SHAPE: "FA_INVALID_SHAPE",
                FA_UNSUPPORTED: "FA_UNSUPPORTED", FA_CUDA_ERROR: "FA_CUDA_ERROR",
                FA_INVALID_ARGUMENT: "FA_INVALID_ARGUMENT", FA_INTERNAL_ERROR: "FA_INTERNAL_ERROR"}

FA_PASS_FORWARD = 0
FA_PASS_BACKWARD = 1
PASS_CODES = {"fwd": FA_PASS_FORWARD, "bwd": FA_PASS_BACKWARD}

# FP8 (ABI version 3): enum fa_dtype, fa_fp8_v_layout, fa_fp8_call
FA_DTYPE_FP16 = 1
FA_DTYPE_BF16 = 2
DTYPE_CODES = {"fp16": FA_DTYPE_FP16, "bf16": FA_DTYPE_BF16}
FA_FP8_V_ROWS = 0
FA_FP8_V_TRANSPOSED = 1
FA_FP8_QUANTIZE = 0
FA_FP8_FORWARD = 1
FA_FP8_ATTENTION = 2
FP8_CALLS = {"quantize": FA_FP8_QUANTIZE, "forward": FA_FP8_FORWARD, "attention": FA_FP8_ATTENTION}

FA_FEATURE_CAUSAL = 1 << 0
FA_FEATURE_GROUPED = 1 << 1
FA_FEATURE_RECTANGULAR = 1 << 2
FA_FEATURE_LSE = 1 << 3
FA_FEATURE_BACKWARD = 1 << 4
# enum fa_feature by the names Stage.features uses
FEATURES = {"causal": FA_FEATURE_CAUSAL, "grouped": FA_FEATURE_GROUPED, "rectangular": FA_FEATURE_RECTANGULAR,
            "lse": FA_FEATURE_LSE, "backward": FA_FEATURE_BACKWARD}

ENV_LIBRARY = "FA_CAPI_LIB"
LIBRARY_NAME = "libfa_capi.so"

# ---- the version 2 structs (field for field as in fa_capi.h; tests/python checks the order) -----


class FaProblem(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("batch", ctypes.c_int64),
        ("q_heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("q_seq", ctypes.c_int64),
        ("kv_seq", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("causal", ctypes.c_int32),
    ]

    @classmethod
    def of(cls, problem: Problem) -> "FaProblem":
        return cls(ctypes.sizeof(cls), problem.batch, problem.q_heads, problem.kv_heads, problem.q_seq,
                   problem.kv_seq, problem.dim, int(problem.causal))


class FaForwardArgs(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("problem", ctypes.POINTER(FaProblem)),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),  # float*: every pointer is an address here, set from an int
        ("workspace", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
    ]


class FaBackwardArgs(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("problem", ctypes.POINTER(FaProblem)),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("grad_o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("grad_q", ctypes.c_void_p),
        ("grad_k", ctypes.c_void_p),
        ("grad_v", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
        ("deterministic", ctypes.c_int32),  # ABI version 4
    ]


class FaFp8QuantizeArgs(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("problem", ctypes.POINTER(FaProblem)),
        ("dtype", ctypes.c_int32),
        ("rotate", ctypes.c_int32),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("q_fp8", ctypes.c_void_p),
        ("k_fp8", ctypes.c_void_p),
        ("v_fp8", ctypes.c_void_p),
        ("q_descale", ctypes.c_void_p),
        ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
    ]


class FaFp8ForwardArgs(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("problem", ctypes.POINTER(FaProblem)),
        ("out_dtype", ctypes.c_int32),
        ("v_layout", ctypes.c_int32),
        ("qk_dim", ctypes.c_int64),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("q_descale", ctypes.c_void_p),
        ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
    ]


_FORWARD_ARGS_SIZE = ctypes.sizeof(FaForwardArgs)
_BACKWARD_ARGS_SIZE = ctypes.sizeof(FaBackwardArgs)

# name in fa_capi.h -> ctypes Structure (what the layout test compares)
STRUCTS = {"fa_problem": FaProblem, "fa_forward_args": FaForwardArgs, "fa_backward_args": FaBackwardArgs,
           "fa_fp8_quantize_args": FaFp8QuantizeArgs, "fa_fp8_forward_args": FaFp8ForwardArgs}

_i64, _int, _dbl, _str, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p
# function -> (restype, argtypes); version 1 first, then version 2 (optional in an older library)
PROTOTYPES_V1 = {
    "fa_workspace_bytes": (_i64, [_str, _i64, _i64, _i64, _i64, _int]),
    "fa_forward": (_int, [_str, _i64, _i64, _i64, _i64, _int, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr]),
    "fa_stage_count": (_int, []),
    "fa_stage_id": (_str, [_int]),
    "fa_stage_title": (_str, [_str]),
    "fa_stage_backend": (_str, [_str]),
    "fa_stage_precision": (_str, [_str]),
    "fa_stage_source_hash": (_str, [_str]),
    "fa_stage_max_dim": (_i64, [_str]),
    "fa_stage_min_compute_capability": (_int, [_str]),
    "fa_tolerance": (_dbl, [_str, _dbl]),
    "fa_last_error": (_str, []),
}
PROTOTYPES_V2 = {
    "fa_workspace_bytes_v2": (_i64, [_str, ctypes.POINTER(FaProblem), _int]),
    "fa_forward_v2": (_int, [_str, ctypes.POINTER(FaForwardArgs)]),
    "fa_backward_v2": (_int, [_str, ctypes.POINTER(FaBackwardArgs)]),
    "fa_stage_features": (_int, [_str]),
    "fa_stage_architecture": (_str, [_str]),
    "fa_stage_kv_passes": (_dbl, [_str]),
    "fa_abi_version": (_int, []),
}
PROTOTYPES_V3 = {
    "fa_fp8_workspace_bytes": (_i64, [ctypes.POINTER(FaProblem), _int]),
    "fa_fp8_quantize": (_int, [ctypes.POINTER(FaFp8QuantizeArgs)]),
    "fa_fp8_forward": (_int, [ctypes.POINTER(FaFp8ForwardArgs)]),
    "fa_fp8_attention": (_int, [ctypes.POINTER(FaForwardArgs), _int, _int]),
}
PROTOTYPES = {**PROTOTYPES_V1, **PROTOTYPES_V2, **PROTOTYPES_V3}


# ---- errors --------------------------------------------------------------------------------------


class FaError(RuntimeError):
    """A call into the library failed. `status` is the fa_status code (FA_UNSUPPORTED, ...),
    `status_name` its name, `message` the library's fa_last_error() (or ours), `stage` the stage id."""

    def __init__(self, status: int, message: str, stage: str = "", call: str = ""):
        self.status = status
        self.message = message
        self.stage = stage
        self.call = call
        where = f"{call}({stage!r})" if call else (stage or "fa_capi")
        super().__init__(f"{where}: {self.status_name}: {message}")

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, f"status {self.status}")

    @property
    def refused(self) -> bool:
        """The stage does not take this problem (a shape or feature it lacks, a GPU too old): an
        `unsupported` row, not a failure of the stage."""
        return self.status in (FA_INVALID_SHAPE, FA_UNSUPPORTED)


class LibraryNotFoundError(FileNotFoundError):
    """No libfa_capi.so where we looked; the message lists every place searched."""


# ---- finding and loading the library -------------------------------------------------------------

# where `pip install` puts the library: beside this file, inside the package
INSTALLED_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def find_library(path: Optional[str] = None) -> str:
    """The library to load: `path` when given (a file or the folder holding it), else $FA_CAPI_LIB,
    else the one installed with the package. LibraryNotFoundError says which was asked for and why it
    is not there."""
    if path:
        if os.path.isdir(path):
            path = os.path.join(path, LIBRARY_NAME)
        if not os.path.isfile(path):
            raise LibraryNotFoundError(f"no C ABI library at {path} (given explicitly); build it with "
                                       f"`cmake --build build --target fa_capi`")
        return os.path.abspath(path)
    env = os.environ.get(ENV_LIBRARY)
    if env:
        if not os.path.isfile(env):
            raise LibraryNotFoundError(f"${ENV_LIBRARY} is {env}, which is not a file")
        return os.path.abspath(env)
    if os.path.isfile(INSTALLED_LIBRARY):
        return INSTALLED_LIBRARY
    raise LibraryNotFoundError(f"fa_course has no library of its own at {INSTALLED_LIBRARY} (it is imported from "
                               f"a source tree, not installed) and ${ENV_LIBRARY} is not set: install the package "
                               f"(pip install python/), or name a development build: "
                               f"fa_course.Library('build/lib/{LIBRARY_NAME}') or {ENV_LIBRARY}=build/lib/{LIBRARY_NAME}")


def _text(value: Optional[bytes]) -> str:
    return value.decode() if value else ""


def _address(value, name: str = "pointer") -> Optional[int]:
    """The address held by a pointer-like value (see the module docstring); None for NULL."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}: a bool is not an address")
    if isinstance(value, int):
        return value or None
    if hasattr(value, "data_ptr"):  # torch.Tensor
        return value.data_ptr() or None
    if hasattr(value, "__cuda_array_interface__"):
        return value.__cuda_array_interface__["data"][0] or None
    if hasattr(value, "__array_interface__"):  # numpy.ndarray
        return value.__array_interface__["data"][0] or None
    if hasattr(value, "buffer_info"):  # array.array
        return value.buffer_info()[0] or None
    if isinstance(value, ctypes.c_void_p):
        return value.value
    if isinstance(value, (ctypes._Pointer, ctypes.Array, ctypes.Structure, ctypes._SimpleCData)):
        if isinstance(value, ctypes._Pointer):
            return ctypes.cast(value, ctypes.c_void_p).value
        return ctypes.addressof(value)
    raise TypeError(f"{name}: cannot take the address of a {type(value).__name__}")


def _stream_handle(stream) -> Optional[int]:
    """A cudaStream_t from None, an int, or an object with .cuda_stream (a PyTorch stream)."""
    if stream is None:
        return None
    if hasattr(stream, "cuda_stream"):
        return stream.cuda_stream or None
    if isinstance(stream, int):
        return stream or None
    raise TypeError(f"stream: expected None, an int or an object with .cuda_stream, not {type(stream).__name__}")


# ---- stage facts ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stage:
    """What the library says about one stage (fa_stage_*).

    id: the name fa_forward takes ("05_float4", "07_fp16_pipelined/bf16"); folder: the stage folder
    ("07_fp16_pipelined"), the `stage` column of results rows; backend: "cpu" or "cuda"; precision:
    "fp32", "fp16" or "bf16"; max_dim: the largest head dim; architecture: "cpu", "sm_80+" or
    "sm_90a"; min_compute_capability: 80 for sm_80 (0: CPU); features: a frozenset of "causal",
    "grouped", "rectangular", "lse", "backward"; feature_flags: the same as fa_feature bits;
    kv_passes: K+V reads per query tile the traffic model expects (1.0 FlashAttention, 2.0 for stage
    03's three passes; None from a version 1 library); source_hash: DESIGN.md's source_hash.
    """

    id: str
    title: str
    backend: str
    precision: str
    max_dim: int
    architecture: str
    min_compute_capability: int
    feature_flags: int
    kv_passes: Optional[float]
    source_hash: str

    @property
    def features(self) -> FrozenSet[str]:
        return frozenset(name for name, bit in FEATURES.items() if self.feature_flags & bit)

    def supports(self, feature: str) -> bool:
        return bool(self.feature_flags & FEATURES[feature])

    @property
    def folder(self) -> str:
        return self.id.split("/")[0]

    @property
    def number(self) -> int:
        return int(self.id[:2])

    @property
    def is_cuda(self) -> bool:
        return self.backend == "cuda"

    def missing_features(self, problem: Problem, lse: bool = False, pass_: str = "fwd") -> List[str]:
        """The features `problem` needs that the stage lacks (the library's check is the final word)."""
        needed = []
        if problem.causal:
            needed.append("causal")
        if problem.grouped:
            needed.append("grouped")
        if problem.rectangular:
            needed.append("rectangular")
        if lse:
            needed.append("lse")
        if pass_ != "fwd":
            needed.append("backward")
        return [n for n in needed if not self.supports(n)]


# ---- the library ---------------------------------------------------------------------------------


class Library:
    """One loaded libfa_capi.so. Methods raise FaError with the library's message on failure."""

    def __init__(self, path: Optional[str] = None):
        self.path = find_library(path)
        try:
            self._lib = ctypes.CDLL(self.path)
        except OSError as error:
            raise LibraryNotFoundError(f"cannot load {self.path}: {error}") from None
        missing = []
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                function = getattr(self._lib, name)
            except AttributeError:
                missing.append(name)
                continue
            function.restype = restype
            function.argtypes = argtypes
        v1_missing = [n for n in missing if n in PROTOTYPES_V1]
        if v1_missing:
            raise LibraryNotFoundError(f"{self.path} is not the course's C ABI library: it lacks "
                                       f"{', '.join(v1_missing)}")
        self.abi_version = self._lib.fa_abi_version() if "fa_abi_version" not in missing else 1
        v2_missing = [n for n in missing if n in PROTOTYPES_V2]
        if self.abi_version >= 2 and v2_missing:
            raise LibraryNotFoundError(f"{self.path} reports ABI version {self.abi_version} but lacks "
                                       f"{', '.join(v2_missing)}")
        v3_missing = [n for n in missing if n in PROTOTYPES_V3]
        if self.abi_version >= 3 and v3_missing:
            raise LibraryNotFoundError(f"{self.path} reports ABI version {self.abi_version} but lacks "
                                       f"{', '.join(v3_missing)}")
        self._stages: Optional[List[Stage]] = None

    def __repr__(self):
        return f"Library({self.path!r}, abi_version={self.abi_version})"

    @property
    def handle(self) -> ctypes.CDLL:
        """The raw ctypes library, prototypes set (for calls this class does not wrap)."""
        return self._lib

    def last_error(self) -> str:
        return _text(self._lib.fa_last_error())

    # ---- facts ---------------------------------------------------------------------------------
    def stages(self) -> List[Stage]:
        """Every stage in course order (the CPU stage included)."""
        if self._stages is None:
            lib = self._lib
            found = []
            for index in range(lib.fa_stage_count()):
                raw = lib.fa_stage_id(index)
                found.append(self._describe(raw))
            self._stages = found
        return list(self._stages)

    def _describe(self, raw: bytes) -> Stage:
        lib = self._lib
        backend = _text(lib.fa_stage_backend(raw))
        capability = lib.fa_stage_min_compute_capability(raw)
        if self.abi_version >= 2:
            flags = lib.fa_stage_features(raw)
            architecture = _text(lib.fa_stage_architecture(raw))
            kv_passes = lib.fa_stage_kv_passes(raw)
            kv_passes = None if kv_passes < 0 else kv_passes
        else:  # every stage of the first part takes causal masking
            flags = FA_FEATURE_CAUSAL
            architecture = "cpu" if backend == "cpu" else f"sm_{capability}+"
            kv_passes = None
        return Stage(id=raw.decode(), title=_text(lib.fa_stage_title(raw)), backend=backend,
                     precision=_text(lib.fa_stage_precision(raw)), max_dim=int(lib.fa_stage_max_dim(raw)),
                     architecture=architecture, min_compute_capability=int(capability), feature_flags=int(flags),
                     kv_passes=kv_passes, source_hash=_text(lib.fa_stage_source_hash(raw)))

    def stage(self, stage_id: str) -> Stage:
        """The stage with this id; FaError FA_UNKNOWN_STAGE otherwise."""
        for stage in self.stages():
            if stage.id == stage_id:
                return stage
        raise FaError(FA_UNKNOWN_STAGE, f"no stage '{stage_id}' (the library has: "
                                        f"{', '.join(s.id for s in self.stages())})", stage_id)

    def select(self, selector: str) -> List[Stage]:
        """Stages by id ('07_fp16_pipelined/bf16'), folder ('07_fp16_pipelined': both precisions) or
        number ('7', '07'); several separated by commas; 'all' for every stage."""
        if selector.strip() == "all":
            return self.stages()
        chosen = []
        for item in (part.strip() for part in selector.split(",")):
            if not item:
                continue
            matches = [s for s in self.stages() if s.id == item or s.folder == item
                       or (item.isdigit() and s.id[:2] == item.zfill(2))]
            if not matches:
                raise FaError(FA_UNKNOWN_STAGE, f"no stage '{item}' (the library has: "
                                                f"{', '.join(s.id for s in self.stages())})", item)
            chosen.extend(m for m in matches if m not in chosen)
        return chosen

    def tolerance(self, precision: str, max_abs_v: float) -> float:
        """The largest max-abs error a correct stage of `precision` may show (fa::tolerance)."""
        value = self._lib.fa_tolerance(precision.encode(), float(max_abs_v))
        if value < 0:
            raise ValueError(f"unknown precision '{precision}'")
        return value

    # ---- calls ---------------------------------------------------------------------------------
    def workspace_bytes(self, stage_id: str, problem, pass_: str = "fwd", causal: Optional[bool] = None) -> int:
        """Bytes of workspace the pass needs (0: none). FaError when the stage does not take the problem
        (the library does not say whether the shape is invalid or unsupported there: the status is
        FA_UNKNOWN_STAGE for an unknown id and FA_UNSUPPORTED otherwise; the message says which)."""
        problem = Problem.of(problem, causal)
        raw = stage_id.encode()
        if self.abi_version >= 2:
            c_problem = FaProblem.of(problem)
            value = self._lib.fa_workspace_bytes_v2(raw, ctypes.byref(c_problem), PASS_CODES[pass_])
        else:
            self._require_v1(stage_id, problem, pass_=pass_)
            value = self._lib.fa_workspace_bytes(raw, problem.batch, problem.q_heads, problem.q_seq, problem.dim,
                                                 int(problem.causal))
        message = self.last_error() if value < 0 else ""
        if value < 0:
            known = any(s.id == stage_id for s in self.stages())
            raise FaError(FA_UNSUPPORTED if known else FA_UNKNOWN_STAGE, message or "refused", stage_id,
                          "fa_workspace_bytes")
        return int(value)

    def unsupported_reason(self, stage_id: str, problem, lse: bool = False, pass_: str = "fwd") -> str:
        """'' when the stage takes this problem (with an LSE output when `lse`), else the library's
        one-line reason. Needs no GPU and runs nothing."""
        problem = Problem.of(problem)
        try:
            stage = self.stage(stage_id)
            self.workspace_bytes(stage_id, problem, pass_)
        except FaError as error:
            return error.message
        if lse and not stage.supports("lse"):
            return f"{stage_id} does not write the log-sum-exp (no FA_FEATURE_LSE)"
        return ""

    def _require_v1(self, stage_id: str, problem: Problem, lse=None, pass_: str = "fwd"):
        """A version 1 library runs the square forward pass only."""
        if not problem.is_square or lse is not None or pass_ != "fwd":
            raise FaError(FA_UNSUPPORTED, f"{self.path} has C ABI version 1: square (B, H, N, D) forward passes "
                                          f"only, without the log-sum-exp; rebuild it for {problem.describe()}",
                          stage_id)

    def forward(self, stage_id: str, problem, q, k, v, o, lse=None, causal: Optional[bool] = None, stream=None,
                workspace=None) -> None:
        """O = softmax(Q K^T / sqrt(D)) V for `problem` (a Problem, or a (B, H, N, D) or
        (B, Hq, Hkv, Nq, Nk, D) tuple; `causal` overrides its flag), and the FP32 log-sum-exp into
        `lse` when given. Returns when the CPU stage is done, or when a CUDA stage's work is queued on
        `stream`. Raises FaError (with .refused for a problem the stage does not take)."""
        problem = Problem.of(problem, causal)
        pointers = [_address(value, name) for name, value in
                    (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("workspace", workspace))]
        stream_handle = _stream_handle(stream)
        if self.abi_version >= 2:
            self.run_forward(stage_id.encode(), ctypes.pointer(FaProblem.of(problem)), *pointers, stream_handle)
            return
        self._require_v1(stage_id, problem, pointers[4])
        q_address, k_address, v_address, o_address, _, workspace_address = pointers
        status = self._lib.fa_forward(stage_id.encode(), problem.batch, problem.q_heads, problem.q_seq, problem.dim,
                                      int(problem.causal), q_address, k_address, v_address, o_address,
                                      workspace_address, stream_handle)
        if status != FA_OK:
            raise FaError(status, self.last_error(), stage_id, "fa_forward")

    def backward(self, stage_id: str, problem, q, k, v, o, grad_o, lse, grad_q, grad_k, grad_v,
                 causal: Optional[bool] = None, stream=None, workspace=None, deterministic: bool = False) -> None:
        """dQ, dK, dV from Q, K, V, O, dO and the forward's LSE (stages with the backward feature).
        `deterministic`: dQ bitwise the same from run to run (fa_backward_args.deterministic: stages
        11 and 13 add dQ's parts in a fixed order instead of FP32 atomics in no fixed order; their
        READMEs say what it costs)."""
        problem = Problem.of(problem, causal)
        if self.abi_version < 2:
            self._require_v1(stage_id, problem, pass_="bwd")
        names = ("q", "k", "v", "o", "grad_o", "lse", "grad_q", "grad_k", "grad_v", "workspace")
        values = (q, k, v, o, grad_o, lse, grad_q, grad_k, grad_v, workspace)
        pointers = [_address(value, name) for name, value in zip(names, values)]
        self.run_backward(stage_id.encode(), ctypes.pointer(FaProblem.of(problem)), *pointers, _stream_handle(stream),
                          deterministic)

    # ---- the calls with everything worked out (fa_course.attention's per-call path) ----------------
    # The stage id as bytes, the problem as a struct (FaProblem.of, wrapped in ctypes.pointer) and
    # every tensor, the workspace and the stream as an int address (or None): nothing is converted
    # or looked up here, so a caller that keeps those between calls pays only for the call itself.
    # call_forward and call_backward take the argument struct filled in (the op fills a copy of one
    # made once per problem, which costs less than building it field by field).

    def run_forward(self, stage_id: bytes, problem_pointer, q, k, v, o, lse, workspace, stream) -> None:
        self.call_forward(stage_id, FaForwardArgs(_FORWARD_ARGS_SIZE, problem_pointer, q, k, v, o, lse, workspace,
                                                  stream))

    def call_forward(self, stage_id: bytes, args: FaForwardArgs) -> None:
        status = self._lib.fa_forward_v2(stage_id, args)
        if status != FA_OK:
            raise FaError(status, self.last_error(), stage_id.decode(), "fa_forward")

    def run_backward(self, stage_id: bytes, problem_pointer, q, k, v, o, grad_o, lse, grad_q, grad_k, grad_v,
                     workspace, stream, deterministic: bool) -> None:
        self.call_backward(stage_id, FaBackwardArgs(_BACKWARD_ARGS_SIZE, problem_pointer, q, k, v, o, grad_o, lse,
                                                    grad_q, grad_k, grad_v, workspace, stream, int(deterministic)))

    def call_backward(self, stage_id: bytes, args: FaBackwardArgs) -> None:
        if args.deterministic and self.abi_version < 4:
            raise FaError(FA_UNSUPPORTED, f"{self.path} has C ABI version {self.abi_version}, without the "
                                          f"deterministic backward pass (version 4): rebuild it",
                          stage_id.decode(), "fa_backward")
        status = self._lib.fa_backward_v2(stage_id, args)
        if status != FA_OK:
            raise FaError(status, self.last_error(), stage_id.decode(), "fa_backward")

    # ---- FP8 (ABI version 3): stage 14's forward pass, fa_fp8_* -----------------------------------
    # Addresses and the stream as the calls above take them; fa_course.fp8 checks PyTorch tensors
    # and allocates them. Each raises FaError with the library's message.

    def _require_fp8(self, call: str) -> None:
        if self.abi_version < 3:
            raise FaError(FA_UNSUPPORTED, f"{self.path} has C ABI version {self.abi_version}, without the FP8 calls "
                                          f"(version 3): rebuild it", "14_fp8", call)

    def fp8_workspace_bytes(self, problem, call: str) -> int:
        """Bytes of workspace fa_fp8_<call> ('quantize', 'forward' or 'attention') needs."""
        self._require_fp8("fa_fp8_workspace_bytes")
        c_problem = FaProblem.of(Problem.of(problem))
        value = self._lib.fa_fp8_workspace_bytes(ctypes.byref(c_problem), FP8_CALLS[call])
        if value < 0:
            raise FaError(FA_INVALID_SHAPE, self.last_error() or "refused", "14_fp8", "fa_fp8_workspace_bytes")
        return int(value)

    def fp8_quantize(self, problem, dtype: str, rotate: bool, q, k, v, q_fp8, k_fp8, v_fp8, q_descale, k_descale,
                     v_descale, workspace, stream=None) -> None:
        """fa_fp8_quantize: 16-bit (`dtype` 'fp16' or 'bf16') Q, K, V to e4m3 and descales."""
        self._require_fp8("fa_fp8_quantize")
        c_problem = FaProblem.of(Problem.of(problem))
        names = ("q", "k", "v", "q_fp8", "k_fp8", "v_fp8", "q_descale", "k_descale", "v_descale", "workspace")
        values = (q, k, v, q_fp8, k_fp8, v_fp8, q_descale, k_descale, v_descale, workspace)
        args = FaFp8QuantizeArgs(ctypes.sizeof(FaFp8QuantizeArgs), ctypes.pointer(c_problem), DTYPE_CODES[dtype],
                                 int(bool(rotate)), *(_address(value, name) for name, value in zip(names, values)),
                                 _stream_handle(stream))
        status = self._lib.fa_fp8_quantize(args)
        if status != FA_OK:
            raise FaError(status, self.last_error(), "14_fp8", "fa_fp8_quantize")

    def fp8_forward(self, problem, out_dtype: str, v_layout: int, qk_dim: int, q, k, v, q_descale, k_descale,
                    v_descale, o, lse=None, workspace=None, stream=None) -> None:
        """fa_fp8_forward: O (and the LSE) from e4m3 Q, K, V and their descales (fa_capi.h's shapes)."""
        self._require_fp8("fa_fp8_forward")
        c_problem = FaProblem.of(Problem.of(problem))
        names = ("q", "k", "v", "q_descale", "k_descale", "v_descale", "o", "lse", "workspace")
        values = (q, k, v, q_descale, k_descale, v_descale, o, lse, workspace)
        args = FaFp8ForwardArgs(ctypes.sizeof(FaFp8ForwardArgs), ctypes.pointer(c_problem), DTYPE_CODES[out_dtype],
                                int(v_layout), int(qk_dim),
                                *(_address(value, name) for name, value in zip(names, values)),
                                _stream_handle(stream))
        status = self._lib.fa_fp8_forward(args)
        if status != FA_OK:
            raise FaError(status, self.last_error(), "14_fp8", "fa_fp8_forward")

    def fp8_attention(self, problem, dtype: str, rotate: bool, q, k, v, o, lse=None, workspace=None,
                      stream=None) -> None:
        """fa_fp8_attention: 16-bit Q, K, V in, O of that type out, quantized inside."""
        self._require_fp8("fa_fp8_attention")
        c_problem = FaProblem.of(Problem.of(problem))
        pointers = [_address(value, name) for name, value in
                    (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("workspace", workspace))]
        args = FaForwardArgs(_FORWARD_ARGS_SIZE, ctypes.pointer(c_problem), *pointers, _stream_handle(stream))
        status = self._lib.fa_fp8_attention(args, DTYPE_CODES[dtype], int(bool(rotate)))
        if status != FA_OK:
            raise FaError(status, self.last_error(), "14_fp8", "fa_fp8_attention")


# ---- module-level conveniences over one shared library -----------------------------------------

_default: Optional[Library] = None
_default_lock = threading.Lock()


def load(path: Optional[str] = None) -> Library:
    """The library at `path`, or (without one) the shared default library, loaded on first use."""
    global _default
    if path is not None:
        return Library(path)
    with _default_lock:
        if _default is None:
            _default = Library()
        return _default


def stages(path: Optional[str] = None) -> List[Stage]:
    return load(path).stages()


def stage(stage_id: str) -> Stage:
    return load().stage(stage_id)


def workspace_bytes(stage_id: str, problem, pass_: str = "fwd", causal: Optional[bool] = None) -> int:
    return load().workspace_bytes(stage_id, problem, pass_, causal)


def forward(stage_id: str, problem, q, k, v, o, lse=None, causal: Optional[bool] = None, stream=None,
            workspace=None) -> None:
    """Library.forward on the default library."""
    load().forward(stage_id, problem, q, k, v, o, lse=lse, causal=causal, stream=stream, workspace=workspace)


def feature_names(flags: int) -> Dict[str, bool]:
    return {name: bool(flags & bit) for name, bit in FEATURES.items()}
