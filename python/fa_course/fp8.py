"""FP8 (e4m3) attention, forward only: stage 14 through the C ABI (fa_fp8_*, api/fa_capi.h), on an
H100 or H200 (sm_90) alone.

    import torch, fa_course
    out = fa_course.fp8.attention(q, k, v, causal=True)        # 16-bit in and out, quantized inside
    quantized = fa_course.fp8.quantize(q, k, v)                # e4m3 tensors and their descales
    out = fa_course.fp8.attention_quantized(quantized, causal=True)
    out = fa_course.fp8.attention_quantized(q8, k8, v8, q_descale, k_descale, v_descale,
                                            out_dtype=torch.bfloat16)   # e4m3 of your own

Tensors are the course's layout, as fa_course.attention takes them: Q (B, Hq, Nq, D), K and V
(B, Hkv, Nk, D), contiguous, on one CUDA device; D = 1 .. 256; causal (bottom-right), grouped-query
heads and Nq != Nk as there; the scale 1 / sqrt(D). Inputs are float16 or bfloat16 (attention,
quantize), or torch.float8_e4m3fn (attention_quantized); O is float16 or bfloat16; the LSE float32
(B, Hq, Nq) with return_lse=True.

The descales (float32): a value is descale * e4m3, and
    O = softmax((q_descale * Q)(k_descale * K)^T / sqrt(D)) (V * v_descale)
with stage 14's blocks: q_descale (B, Hq, ceil(Nq / 128)), one per 128 query rows of a head;
k_descale (B, Hkv, ceil(Nk / 64)), one per 64 keys; v_descale (B, Hkv, D), one per channel.
FlashAttention-3 takes one descale per (batch, KV head) for each of Q, K and V, shape (B, Hkv), and
tensors (B, N, H, D); attention_quantized accepts such (B, Hkv) descales too and repeats them over
the blocks (over each KV head's query heads for Q, over the channels for V); the tensors stay in the
course's (B, H, N, D). quantize() rotates Q and K first (rotate=True: a Hadamard transform, which
leaves Q K^T as it is and spreads outliers), so its Q and K hold rows of Dpad = 64, 128 or 256
codes, and it writes V as the kernel reads it (transposed, keys permuted in groups of 16):
Quantized.v is that layout, not (B, Hkv, Nk, D). attention_quantized takes V in rows and makes it
so itself.

Forward only: there is no FP8 backward pass. A tensor that requires grad, with grad enabled, raises
RuntimeError (call under torch.no_grad() or pass .detach()). Wrong tensors raise TypeError or
ValueError before anything runs (the checks of fa_course.attention); the library's refusals (a GPU
other than sm_90, no GPU) raise FaError. Allocation: PyTorch's caching allocator, on the current
stream, as fa_course.attention does.
"""

import dataclasses
from typing import Optional, Tuple, Union

import torch

from . import capi
from .ops import _raw_stream, check_inputs, on_device
from .problem import Problem

E4M3 = torch.float8_e4m3fn
STAGE = "14_fp8"
QUERY_BLOCK = 128  # query rows per Q descale (stage 14's kQueryBlock)
KEY_BLOCK = 64  # keys per K descale (stage 14's kKeyBlock)
V_KEY_ALIGN = 16  # the transposed V's rows hold keys rounded up to this
# what each call takes, in check_inputs' form: (device type, dtype) -> precision
SIXTEEN_BIT = {("cuda", torch.float16): "fp16", ("cuda", torch.bfloat16): "bf16"}
QUANTIZED = {("cuda", E4M3): "e4m3"}


def padded_dim(dim: int) -> int:
    """Dpad: the head dim's bucket, 64, 128 or 256 (fp8_numerics.hpp, pad_dim)."""
    return 64 if dim <= 64 else 128 if dim <= 128 else 256


def _blocks(count: int, block: int) -> int:
    return (count + block - 1) // block


@dataclasses.dataclass(frozen=True)
class Quantized:
    """What quantize() returns, in stage 14's kernel layouts: q (B, Hq, Nq, Dpad) and k (B, Hkv, Nk,
    Dpad) e4m3 (rotated when `rotated`), v (B, Hkv, Dpad, Nk rounded up to 16) e4m3, transposed with
    the keys of each group of 16 permuted; q_descale (B, Hq, ceil(Nq/128)), k_descale (B, Hkv,
    ceil(Nk/64)), v_descale (B, Hkv, Dpad), float32. `problem` is the attention's (its dim is D),
    `dtype` the 16-bit dtype quantized (O's by default)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    problem: Problem
    dtype: torch.dtype
    rotated: bool


def _forward_only(call: str, *tensors) -> None:
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(f"fa_course.fp8.{call}: FP8 attention is forward only (stage 14 has no backward pass), "
                           f"and an input requires grad: call it under torch.no_grad() or pass .detach()")


def _check(call: str, q, k, v, causal: bool, dtypes) -> Problem:
    problem = check_inputs(q, k, v, causal, who=f"fa_course.fp8.{call}", dtypes=dtypes)
    if problem.dim > 256:
        raise ValueError(f"fa_course.fp8.{call}: head dim {problem.dim} is beyond stage 14's largest, 256")
    return problem


def _descale(name: str, tensor, shape: Tuple[int, ...], fa3_shape: Tuple[int, int], device, repeat) -> torch.Tensor:
    """The descale tensor as stage 14 takes it (float32 `shape`, contiguous), from that shape or from
    FlashAttention-3's (B, Hkv), repeated by `repeat`."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"fa_course.fp8.attention_quantized: {name} must be a torch.Tensor, not "
                        f"{type(tensor).__name__}")
    if tensor.dtype != torch.float32 or tensor.device != device:
        raise TypeError(f"fa_course.fp8.attention_quantized: {name} must be torch.float32 on {device}, not "
                        f"{tensor.dtype} on {tensor.device}")
    if tuple(tensor.shape) == shape:
        return tensor.contiguous()
    if tuple(tensor.shape) == fa3_shape:
        return repeat(tensor).contiguous()
    raise ValueError(f"fa_course.fp8.attention_quantized: {name} must have shape {shape} (stage 14's blocks) or "
                     f"{fa3_shape} (FlashAttention-3's, one per batch and KV head), not {tuple(tensor.shape)}")


def _out_dtype(out_dtype) -> str:
    precision = SIXTEEN_BIT.get(("cuda", out_dtype))
    if precision is None:
        raise TypeError(f"fa_course.fp8.attention_quantized: out_dtype must be torch.float16 or torch.bfloat16, "
                        f"not {out_dtype}")
    return precision


def _outputs(problem: Problem, dtype, device, return_lse: bool):
    out = torch.empty((problem.batch, problem.q_heads, problem.q_seq, problem.dim), dtype=dtype, device=device)
    lse = torch.empty(problem.lse_shape, dtype=torch.float32, device=device) if return_lse else None
    return out, lse


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rotate: bool = True) -> Quantized:
    """float16 or bfloat16 Q, K, V to e4m3 and their descales (Quantized says the layouts), as the
    FP8 attention quantizes them; feed the result to attention_quantized."""
    _forward_only("quantize", q, k, v)
    problem = _check("quantize", q, k, v, False, SIXTEEN_BIT)
    library = capi.load()
    device = q.device
    dim_padded = padded_dim(problem.dim)
    batch, q_heads, kv_heads = problem.batch, problem.q_heads, problem.kv_heads
    with on_device(device):
        q8 = torch.empty((batch, q_heads, problem.q_seq, dim_padded), dtype=E4M3, device=device)
        k8 = torch.empty((batch, kv_heads, problem.kv_seq, dim_padded), dtype=E4M3, device=device)
        v8 = torch.empty((batch, kv_heads, dim_padded, _blocks(problem.kv_seq, V_KEY_ALIGN) * V_KEY_ALIGN),
                         dtype=E4M3, device=device)
        q_descale = torch.empty((batch, q_heads, _blocks(problem.q_seq, QUERY_BLOCK)), dtype=torch.float32,
                                device=device)
        k_descale = torch.empty((batch, kv_heads, _blocks(problem.kv_seq, KEY_BLOCK)), dtype=torch.float32,
                                device=device)
        v_descale = torch.empty((batch, kv_heads, dim_padded), dtype=torch.float32, device=device)
        workspace = torch.empty(library.fp8_workspace_bytes(problem, "quantize"), dtype=torch.uint8, device=device)
        library.fp8_quantize(problem, SIXTEEN_BIT[("cuda", q.dtype)], rotate, q, k, v, q8, k8, v8, q_descale,
                             k_descale, v_descale, workspace, _raw_stream(device.index))
    return Quantized(q8, k8, v8, q_descale, k_descale, v_descale, problem, q.dtype, bool(rotate))


def attention_quantized(q: Union[Quantized, torch.Tensor], k: Optional[torch.Tensor] = None,
                        v: Optional[torch.Tensor] = None, q_descale: Optional[torch.Tensor] = None,
                        k_descale: Optional[torch.Tensor] = None, v_descale: Optional[torch.Tensor] = None, *,
                        causal: bool = False, out_dtype: Optional[torch.dtype] = None, return_lse: bool = False):
    """O (and the LSE with return_lse) from e4m3 inputs: a Quantized (quantize's), or Q, K, V
    torch.float8_e4m3fn (B, H, N, D) and their descales (the module docstring's shapes, or
    FlashAttention-3's (B, Hkv)). out_dtype: float16 or bfloat16 (default: a Quantized's own dtype,
    else bfloat16)."""
    if isinstance(q, Quantized):
        if any(x is not None for x in (k, v, q_descale, k_descale, v_descale)):
            raise TypeError("fa_course.fp8.attention_quantized: with a Quantized, pass no other tensors")
        quantized = q
        problem = dataclasses.replace(quantized.problem, causal=bool(causal))
        precision = _out_dtype(out_dtype or quantized.dtype)
        tensors = (quantized.q, quantized.k, quantized.v, quantized.q_descale, quantized.k_descale,
                   quantized.v_descale)
        v_layout, qk_dim = capi.FA_FP8_V_TRANSPOSED, padded_dim(problem.dim)
    else:
        _forward_only("attention_quantized", q, k, v)
        problem = _check("attention_quantized", q, k, v, causal, QUANTIZED)
        precision = _out_dtype(out_dtype or torch.bfloat16)
        batch, q_heads, kv_heads = problem.batch, problem.q_heads, problem.kv_heads
        group = q_heads // kv_heads
        q_blocks, k_blocks = _blocks(problem.q_seq, QUERY_BLOCK), _blocks(problem.kv_seq, KEY_BLOCK)
        fa3 = (batch, kv_heads)
        tensors = (q, k, v,
                   _descale("q_descale", q_descale, (batch, q_heads, q_blocks), fa3, q.device,
                            lambda x: x.repeat_interleave(group, dim=1)[:, :, None].expand(-1, -1, q_blocks)),
                   _descale("k_descale", k_descale, (batch, kv_heads, k_blocks), fa3, q.device,
                            lambda x: x[:, :, None].expand(-1, -1, k_blocks)),
                   _descale("v_descale", v_descale, (batch, kv_heads, problem.dim), fa3, q.device,
                            lambda x: x[:, :, None].expand(-1, -1, problem.dim)))
        v_layout, qk_dim = capi.FA_FP8_V_ROWS, problem.dim
    library = capi.load()
    device = tensors[0].device
    with on_device(device):
        out, lse = _outputs(problem, torch.float16 if precision == "fp16" else torch.bfloat16, device, return_lse)
        arranges = qk_dim != padded_dim(problem.dim) or v_layout == capi.FA_FP8_V_ROWS
        workspace = (torch.empty(library.fp8_workspace_bytes(problem, "forward"), dtype=torch.uint8, device=device)
                     if arranges else None)
        library.fp8_forward(problem, precision, v_layout, qk_dim, *tensors, out, lse, workspace,
                            _raw_stream(device.index))
    return (out, lse) if return_lse else out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, rotate: bool = True,
              return_lse: bool = False):
    """softmax(Q K^T / sqrt(D)) V through FP8: float16 or bfloat16 Q, K, V quantized to e4m3 (Q and
    K rotated first when `rotate`) and stage 14's kernel, O in the inputs' dtype (and the LSE with
    return_lse), in one library call. Forward only."""
    _forward_only("attention", q, k, v)
    problem = _check("attention", q, k, v, causal, SIXTEEN_BIT)
    library = capi.load()
    device = q.device
    with on_device(device):
        out, lse = _outputs(problem, q.dtype, device, return_lse)
        workspace = torch.empty(library.fp8_workspace_bytes(problem, "attention"), dtype=torch.uint8, device=device)
        library.fp8_attention(problem, SIXTEEN_BIT[("cuda", q.dtype)], rotate, q, k, v, out, lse, workspace,
                              _raw_stream(device.index))
    return (out, lse) if return_lse else out


__all__ = ["quantize", "attention_quantized", "attention", "Quantized", "padded_dim", "E4M3"]
