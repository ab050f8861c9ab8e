#!/usr/bin/env python3
"""Trains the training example's model (python/examples/train_attention.py: a small character-level
transformer, 8 query heads over 2 K/V heads, causal) with each sequence split across the ranks of
torchrun by stage 15's zigzag: every rank holds chunks r and 2P-1-r of each sequence (their tokens
and positions), its attention is fa_course.ring.ring_attention, and the weights' gradients are
averaged over the ranks. Rank 0 also trains a twin from the same start on whole sequences with
fa_course.ops.attention on one device; the two losses should track each other within 16-bit noise.

  torchrun --nproc_per_node=2 python/examples/train_ring.py                  # GPUs over NCCL, BF16 autocast
  torchrun --nproc_per_node=2 python/examples/train_ring.py --cpu --steps 20 # CPU processes over gloo, FP32

Set NCCL_NVLS_ENABLE=0 where NVLink multicast must stay off. Exit status: 0 when the final losses
(mean of the last 20 steps) agree within --agreement (relative), 1 when they do not, 2 when it cannot
run here.
"""

import argparse
import copy
import importlib.util
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # python/: the package of this checkout


def load_training_example():
    """train_attention.py (beside this file) as a module: its model and its text."""
    spec = importlib.util.spec_from_file_location("train_attention", os.path.join(HERE, "train_attention.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024, help="characters per sequence, split across the ranks")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agreement", type=float, default=0.05)
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="CPU processes over gloo, FP32 (the CPU stages)")
    args = parser.parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        print(f"train_ring: PyTorch is needed ({error})", file=sys.stderr)
        return 2
    if "RANK" not in os.environ:
        print("train_ring: launch it with torchrun (torchrun --nproc_per_node=P python/examples/train_ring.py)", file=sys.stderr)
        return 2
    from fa_course import ops
    from fa_course.ring import ring_attention, zigzag_shard

    example = load_training_example()
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.seq % (2 * world):
        print(f"train_ring: --seq {args.seq} must be a multiple of 2·P = {2 * world}", file=sys.stderr)
        return 2

    text = example.load_text()
    alphabet = sorted(set(text))
    code = {c: i for i, c in enumerate(alphabet)}
    data = torch.tensor([code[c] for c in text], dtype=torch.long, device=device)
    torch.manual_seed(args.seed)  # the same weights on every rank
    model = example.build_model(torch, len(alphabet), args,
                                lambda q, k, v: ring_attention(q, k, v, causal=True)).to(device)
    twin = None
    if rank == 0:
        twin = copy.deepcopy(model)
        for block in twin.blocks:
            block.attention = lambda q, k, v: ops.attention(q, k, v, causal=True)
    positions = zigzag_shard(torch.arange(args.seq, device=device)[None, None, :, None], rank, world)[0, 0, :, 0]

    def run(net, tokens, where):
        x = net.embed(tokens) + net.position[where]
        for block in net.blocks:
            x = block(x)
        return net.head(net.norm(x))

    def loss_of(net, inputs, targets, where):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.cpu):
            logits = run(net, inputs, where)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    optimizers = [torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.0)
                  for net in (model, twin) if net is not None]
    generator = torch.Generator(device=device).manual_seed(args.seed)  # the same batches on every rank
    losses = ([], [])
    if rank == 0:
        print(f"{world} ranks ({'gloo, CPU' if args.cpu else 'NCCL'}), {args.seq} characters a sequence, "
              f"{args.seq // world} a rank; {'step':>6} {'loss ring':>10} {'loss whole':>11}", flush=True)
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), device=device, generator=generator)
        window = data[starts[:, None] + torch.arange(args.seq + 1, device=device)[None, :]]
        inputs, targets = window[:, :-1], window[:, 1:]
        shard = [zigzag_shard(t[:, None, :, None], rank, world)[:, 0, :, 0] for t in (inputs, targets)]
        optimizers[0].zero_grad(set_to_none=True)
        loss = loss_of(model, shard[0], shard[1], positions)
        loss.backward()
        for parameter in model.parameters():  # the mean over every rank's tokens
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizers[0].step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses[0].append(total.item() / world)
        if twin is not None:
            optimizers[1].zero_grad(set_to_none=True)
            whole = loss_of(twin, inputs, targets, torch.arange(args.seq, device=device))
            whole.backward()
            optimizers[1].step()
            losses[1].append(whole.item())
            if step % args.print_every == 0 or step in (1, args.steps):
                print(f"{step:>6} {losses[0][-1]:>10.4f} {losses[1][-1]:>11.4f}", flush=True)

    status = 0
    if rank == 0:
        tail = min(20, args.steps)
        final = [sum(run_losses[-tail:]) / tail for run_losses in losses]
        relative = abs(final[0] - final[1]) / max(abs(final[1]), 1e-12)
        agree = relative <= args.agreement and all(math.isfinite(x) for x in final)
        print(f"final losses: ring {final[0]:.4f}, whole {final[1]:.4f}; they differ by {100 * relative:.2f} % "
              f"({'within' if agree else 'NOT within'} {100 * args.agreement:.0f} %)")
        status = 0 if agree else 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
