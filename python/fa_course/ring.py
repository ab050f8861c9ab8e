"""fa_course.ring: stage 15's ring attention as a PyTorch op over torch.distributed, with autograd.

Every rank (one process a GPU, launched by torchrun, NCCL backend; or CPU processes over gloo) holds
its zigzag shard of the sequence: chunks r and 2P-1-r of 2P equal chunks (zigzag_shard). At each step
it sends the K/V block in hand to the next rank while the course's attention op computes on it; the
partial (O, LSE) of the steps merge by their log-sum-exp in FP32. The backward pass walks the same
ring: dK and dV travel with their blocks and come home summed. stages/15_ring/README.md is the lesson.

    import torch.distributed as dist
    from fa_course.ring import ring_attention, zigzag_shard
    dist.init_process_group("nccl")                     # torchrun --nproc_per_node=P ...
    q = zigzag_shard(q_whole, dist.get_rank(), dist.get_world_size())   # (B, H, N/P, D), same for k, v
    out = ring_attention(q, k, v, causal=True)          # this rank's shard of O; out.backward(...) works

Set NCCL_NVLS_ENABLE=0 where NVLink multicast must stay off. Importing this module imports PyTorch
and fa_course.ops (the local op: stage 10 or 08 forward, 11 backward on the GPU; 01 and 11 on the CPU).
"""

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import ops


def zigzag_shard(x: torch.Tensor, rank: int, world: int, seq_dim: int = 2) -> torch.Tensor:
    """Rank `rank`'s shard of the whole tensor `x`: chunks rank and 2·world-1-rank of its sequence."""
    if x.shape[seq_dim] % (2 * world):
        raise ValueError(f"fa_course.ring: the sequence ({x.shape[seq_dim]}) must split into 2·P = {2 * world} "
                         f"equal chunks")
    chunks = x.chunk(2 * world, dim=seq_dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=seq_dim).contiguous()


def zigzag_unshard(shards: Sequence[torch.Tensor], seq_dim: int = 2) -> torch.Tensor:
    """The whole tensor from every rank's shard, in rank order (zigzag_shard's inverse)."""
    world = len(shards)
    chunks: List[Optional[torch.Tensor]] = [None] * (2 * world)
    for rank, shard in enumerate(shards):
        chunks[rank], chunks[2 * world - 1 - rank] = shard.chunk(2, dim=seq_dim)
    return torch.cat(chunks, dim=seq_dim)


def block_task(rank: int, source: int, causal: bool) -> Tuple[str, str, bool]:
    """Which of this rank's queries ('both' chunks or the 'second') meet which of the block's keys
    ('both' or the 'first' chunk), and whether the mask applies inside (ring_schedule.hpp)."""
    if not causal:
        return "both", "both", False
    if source == rank:
        return "both", "both", True
    if source < rank:
        return "both", "first", False
    return "second", "both", False


class _Ring:
    """This rank's neighbours in `group`, and passes: every rank sends tensors to the next and
    receives the previous rank's, asynchronously (torch.distributed.batch_isend_irecv)."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next = to_global((self.rank + 1) % self.world)
        self.previous = to_global((self.rank - 1) % self.world)

    def start(self, tensors: Sequence[torch.Tensor]):
        received = [torch.empty_like(t) for t in tensors]
        operations = []
        for sent, into in zip(tensors, received):
            operations.append(dist.P2POp(dist.isend, sent, self.next, self.group))
            operations.append(dist.P2POp(dist.irecv, into, self.previous, self.group))
        return dist.batch_isend_irecv(operations), received

    @staticmethod
    def finish(pending) -> List[torch.Tensor]:
        works, received = pending
        for work in works:
            work.wait()
        return received


def _rows(tensor: torch.Tensor, half: str, seq_dim: int = 2) -> torch.Tensor:
    chunk = tensor.shape[seq_dim] // 2
    if half == "both":
        return tensor
    return tensor.narrow(seq_dim, chunk if half == "second" else 0, chunk).contiguous()


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """out, lse (FP32 views) := the log-sum-exp merge of themselves with one block's (O, LSE)."""
    merged = torch.logaddexp(lse, block_lse)
    safe = torch.where(torch.isinf(merged), torch.zeros_like(merged), merged)  # rows that saw no key yet
    out.mul_(torch.exp(lse - safe).unsqueeze(-1)).add_(torch.exp(block_lse - safe).unsqueeze(-1) * block_out.float())
    lse.copy_(merged)


def _forward(q, k, v, causal: bool, ring: _Ring):
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    k_held, v_held = k, v
    for step in range(ring.world):
        pending = ring.start([k_held, v_held]) if step + 1 < ring.world else None  # sent on while we compute
        queries, keys, masked = block_task(ring.rank, (ring.rank - step) % ring.world, causal)
        block_out, block_lse = ops.attention_with_lse(_rows(q, queries), _rows(k_held, keys), _rows(v_held, keys),
                                                      masked)
        if queries == "both":
            _merge(out, lse, block_out, block_lse)
        else:
            chunk = q.shape[2] // 2
            _merge(out[:, :, chunk:], lse[:, :, chunk:], block_out, block_lse)
        if pending is not None:
            k_held, v_held = ring.finish(pending)
    return out.to(q.dtype), lse


def _backward(grad_out, q, k, v, out, lse, causal: bool, ring: _Ring, deterministic: bool):
    chunk = q.shape[2] // 2
    grad_q = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    grad_kv = [torch.zeros(k.shape, dtype=torch.float32, device=k.device),
               torch.zeros(v.shape, dtype=torch.float32, device=v.device)]
    k_held, v_held = k, v
    grads_pending = None
    for step in range(ring.world):
        kv_pending = ring.start([k_held, v_held]) if step + 1 < ring.world else None
        queries, keys, masked = block_task(ring.rank, (ring.rank - step) % ring.world, causal)
        block_dq, block_dk, block_dv = ops.attention_backward(
            _rows(grad_out, queries), _rows(q, queries), _rows(k_held, keys), _rows(v_held, keys),
            _rows(out, queries), _rows(lse, queries), masked, deterministic=deterministic)
        (grad_q if queries == "both" else grad_q[:, :, chunk:]).add_(block_dq.float())
        if grads_pending is not None:  # this block's dK, dV so far, from the rank before
            grad_kv = ring.finish(grads_pending)
        for total, block in zip(grad_kv, (block_dk, block_dv)):
            (total if keys == "both" else total[:, :, :chunk]).add_(block.float())
        if ring.world > 1:  # dK, dV follow their block: on to the next rank, home after the last step
            grads_pending = ring.start(grad_kv)
        if kv_pending is not None:
            k_held, v_held = ring.finish(kv_pending)
    if grads_pending is not None:
        grad_kv = ring.finish(grads_pending)
    return grad_q.to(q.dtype), grad_kv[0].to(k.dtype), grad_kv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group, deterministic):
        ring = _Ring(group)
        out, lse = _forward(q, k, v, causal, ring)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        ctx.group = group
        ctx.deterministic = deterministic
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        deterministic = ops.backward_is_deterministic(ctx.deterministic)
        grads = _backward(grad_out.contiguous(), q, k, v, out, lse, ctx.causal, _Ring(ctx.group), deterministic)
        return (*grads, None, None, None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   group=None, *, deterministic: bool = False) -> torch.Tensor:
    """This rank's shard of attention over the whole sequence that the ranks of `group` (default:
    the world) hold in zigzag shards (zigzag_shard). q: (B, Hq, 2c, D), k and v: (B, Hkv, 2c, D),
    the same c on every rank; differentiable in q, k and v. `deterministic`: dQ, dK and dV bitwise
    the same from run to run (each step's backward in its deterministic mode, as fa_course.attention's;
    also when torch.use_deterministic_algorithms(True) is in force when the backward pass runs)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fa_course.ring_attention needs torch.distributed initialized "
                           "(dist.init_process_group; torchrun sets up the environment)")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 4 or tensor.shape[2] % 2:
            raise ValueError(f"fa_course.ring_attention: {name} must be (B, H, 2c, D), a zigzag shard; "
                             f"got shape {tuple(tensor.shape)}")
    if q.shape[2] != k.shape[2] or k.shape != v.shape:
        raise ValueError(f"fa_course.ring_attention: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
                         f"must be shards of one sequence (the same 2c, and k, v of one shape)")
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, group, bool(deterministic))
