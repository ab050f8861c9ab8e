#!/usr/bin/env python3
"""fa_course.ring (stage 15's ring attention over torch.distributed) against attention on the whole
sequence in float64 (computed here with PyTorch from the same rounded inputs): O of every rank's
shard and dQ, dK, dV through autograd, causal and not, grouped-query heads included.

  python3 tests/torch/test_ring.py            CPU: P = 1, 2, 3 processes over gloo, the CPU stages (ctest)
  torchrun --nproc_per_node=P tests/torch/test_ring.py --gpu [--time N ...]
                                              GPUs over NCCL, BF16; --time: rank 0 prints fwd and
                                              fwd+bwd times of the ring against one GPU on the whole sequence

Exit 77 (ctest's "skipped") with the reason when PyTorch or the built library is missing; with
FA_REQUIRE_GPU=1 that is a failure instead.
"""

import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import availability  # noqa: E402  (also puts the fa_course package on sys.path)

SKIP_EXIT_CODE = 77
# (B, Hq, Hkv, N, D) per P: N a multiple of 2P with chunks that are not multiples of a tile
CPU_SHAPES = [(2, 2, 2, 26, 16), (1, 4, 2, 74, 32)]
GPU_SHAPES = [(2, 4, 4, 208, 64), (1, 8, 2, 1000, 128), (1, 4, 1, 4096, 128)]


def reference(q, k, v, grad_out, causal):
    """O, dQ, dK, dV in float64 straight from the definition (causal: query i sees keys 0..i)."""
    import torch

    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    out = torch.softmax(scores, -1) @ v.repeat_interleave(group, 1)
    out.backward(grad_out.double())
    return out.detach(), q.grad, k.grad, v.grad


def check_case(shape, causal, dtype, device, seed):
    """One problem through the ring on this rank, against the whole-sequence reference; raises on a
    mismatch. Every rank draws the same whole tensors from `seed` and takes its shard."""
    import torch
    import torch.distributed as dist
    from fa_course.ring import ring_attention, zigzag_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    batch, q_heads, kv_heads, seq, dim = shape
    generator = torch.Generator().manual_seed(seed)
    whole = [torch.rand(batch, heads, seq, dim, generator=generator) * 2 - 1
             for heads in (q_heads, kv_heads, kv_heads, q_heads)]
    q, k, v, grad_out = (t.to(dtype) for t in whole)  # rounded once: the reference sees what the ring sees
    expected = reference(q, k, v, grad_out, causal)
    shards = [zigzag_shard(t, rank, world).to(device).requires_grad_(i < 3) for i, t in enumerate((q, k, v, grad_out))]
    out = ring_attention(shards[0], shards[1], shards[2], causal=causal)
    out.backward(shards[3])
    # FP32 stages: accumulation order; 16-bit: P and O rounded (2u·max|V|, doubled), the gradients'
    # relative L2 error within a few unit roundoffs.
    unit = {torch.float32: 1e-5, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
    label = f"{shape} causal={causal} {dtype} P={world} rank {rank}"
    o_error = (out.double().cpu() - zigzag_shard(expected[0], rank, world)).abs().max().item()
    if not o_error <= 4 * unit * v.abs().max().item():
        raise AssertionError(f"{label}: O max error {o_error:.3g}")
    for name, actual, whole_expected in zip(("dQ", "dK", "dV"), (s.grad for s in shards[:3]), expected[1:]):
        shard_expected = zigzag_shard(whole_expected, rank, world)
        error = (actual.double().cpu() - shard_expected).norm().item() / max(shard_expected.norm().item(), 1e-30)
        if not error <= 8 * unit:
            raise AssertionError(f"{label}: {name} relative L2 error {error:.3g}")
    return o_error


def check_deterministic_reaches_each_step(seed):
    """ring_attention(..., deterministic=True), or torch.use_deterministic_algorithms(True), asks every
    step's local backward for its deterministic mode (fa_course.ops.attention_backward's flag; on the
    CPU stages the gradients are the same either way, so the flag is what is checked)."""
    import torch
    import torch.distributed as dist
    from fa_course import ops
    from fa_course.ring import ring_attention, zigzag_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    asked = []
    local_backward = ops.attention_backward

    def recording_backward(*args, deterministic=False, **kwargs):
        asked.append(deterministic)
        return local_backward(*args, deterministic=deterministic, **kwargs)

    generator = torch.Generator().manual_seed(seed)
    q, k, v = (zigzag_shard(torch.rand(1, 2, 4 * world, 8, generator=generator), rank, world).requires_grad_()
               for _ in range(3))
    ops.attention_backward = recording_backward
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        for deterministic, algorithms, expected in ((False, False, False), (True, False, True), (False, True, True)):
            asked.clear()
            torch.use_deterministic_algorithms(algorithms)
            ring_attention(q, k, v, causal=True, deterministic=deterministic).sum().backward()
            if asked != [expected] * world:
                raise AssertionError(f"deterministic={deterministic}, use_deterministic_algorithms({algorithms}): "
                                     f"the steps' backward passes were asked {asked}, not {[expected] * world}")
    finally:
        ops.attention_backward = local_backward
        torch.use_deterministic_algorithms(previous)


def cpu_worker(rank, world, port):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for index, (batch, q_heads, kv_heads, seq, dim) in enumerate(CPU_SHAPES):
            for causal in (False, True):
                check_case((batch, q_heads, kv_heads, seq * world, dim), causal, torch.float32, "cpu", index)
        check_deterministic_reaches_each_step(len(CPU_SHAPES))
    finally:
        dist.destroy_process_group()


def run_cpu() -> int:
    import torch.multiprocessing as mp

    for world in (2, 3):
        mp.spawn(cpu_worker, args=(world, 29500 + world + os.getpid() % 1000 * 4), nprocs=world)
        print(f"ok: the ring over {world} gloo process(es) equals the float64 reference")
    return 0


def time_whole_and_ring(seq, heads, dim, causal, reps=5):
    """Rank 0's line: one GPU on the whole sequence (fa_course.attention) and the ring, fwd and fwd+bwd."""
    import torch
    import torch.distributed as dist
    import fa_course
    from fa_course.ring import ring_attention, zigzag_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())

    def timed(function):
        for _ in range(2):
            function()
        torch.cuda.synchronize()
        dist.barrier()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            function()
            torch.cuda.synchronize()
            dist.barrier()
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2] * 1e3

    whole = [torch.randn(1, heads, seq, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
             for _ in range(3)]
    shards = [zigzag_shard(t.detach(), rank, world).requires_grad_() for t in whole]
    results = {}
    for label, backward in (("fwd", False), ("fwd+bwd", True)):
        def one_gpu():
            if rank == 0:
                out = fa_course.attention(*whole, causal=causal)
                if backward:
                    out.backward(torch.ones_like(out))

        def ring():
            out = ring_attention(*shards, causal=causal)
            if backward:
                out.backward(torch.ones_like(out))

        results[label] = (timed(one_gpu), timed(ring))
    if rank == 0:
        for label, (single, ringed) in results.items():
            print(f"torch op  N={seq:>6} H={heads} D={dim} {'causal' if causal else 'full  '} {label:<7} "
                  f"1 GPU {single:9.2f} ms   ring of {world} {ringed:9.2f} ms   efficiency {single / (world * ringed):.3f}",
                  flush=True)


def run_gpu(time_lengths) -> int:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    try:
        for index, shape in enumerate(GPU_SHAPES):
            batch, q_heads, kv_heads, seq, dim = shape
            seq = seq // (2 * dist.get_world_size()) * 2 * dist.get_world_size()
            for causal in (False, True):
                check_case((batch, q_heads, kv_heads, seq, dim), causal, torch.bfloat16, "cuda", index)
        if dist.get_rank() == 0:
            print(f"ok: the ring over {dist.get_world_size()} GPUs (NCCL) equals the float64 reference", flush=True)
        for seq in time_lengths:
            for causal in (True, False):
                time_whole_and_ring(seq, 16, 128, causal)
    finally:
        dist.destroy_process_group()
    return 0


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", action="store_true", help="under torchrun: GPUs over NCCL")
    parser.add_argument("--time", type=int, nargs="*", default=[], help="sequence lengths to time (with --gpu)")
    args = parser.parse_args(argv)
    reason = availability.unavailable_reason("gpu" if args.gpu else "cpu")
    if reason:
        if os.environ.get("FA_REQUIRE_GPU") == "1":
            print(f"FAILED: {reason} -- and FA_REQUIRE_GPU=1, so this is a failure, not a skip")
            return 1
        print(f"SKIPPED: {reason}")
        return SKIP_EXIT_CODE
    return run_gpu(args.time) if args.gpu else run_cpu()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
