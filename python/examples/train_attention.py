#!/usr/bin/env python3
"""Trains one small character-level transformer twice from the same start, once with the course's
attention (fa_course.attention: a forward stage and 11_backward through the C ABI) and once with
PyTorch's scaled_dot_product_attention, on the same batches, and prints both losses side by side:
they should track each other within 16-bit noise. The model has grouped-query heads (8 query heads
over 2 K/V heads) and causal masking, in BF16 under autocast; the text is the repository's own
READMEs, so nothing is downloaded.

  python3 python/examples/train_attention.py                       # 300 steps, eager
  python3 python/examples/train_attention.py --compile --csv losses.csv

It uses the installed package (`pip install python/`), from any directory; inside a checkout
without installing, name the package and a library: PYTHONPATH=python FA_CAPI_LIB=build/lib/libfa_capi.so.

--compile runs both models under torch.compile(fullgraph=True), forward and backward: a graph break
in our op would fail it. Exit status: 0 when the two runs' final losses (mean of the last 20 steps) agree within
--agreement (relative); 1 when they do not; 2 without PyTorch, a CUDA GPU or the library, or when no
stage takes the model's attention problem.
"""

import argparse
import copy
import csv
import glob
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the text it trains on

PROGRAM = "train_attention"


def die(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=256, help="characters per sequence (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8, help="query heads (default: %(default)s)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default: %(default)s)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) both models")
    parser.add_argument("--stage", help="the forward stage to run (default: fa_course.attention's choice)")
    parser.add_argument("--csv", help="write step, loss_ours, loss_sdpa to this file")
    parser.add_argument("--print-every", type=int, default=25)
    parser.add_argument("--agreement", type=float, default=0.05,
                        help="largest relative difference of the final losses (default: %(default)s)")
    return parser.parse_args(argv)


def load_text():
    """The repository's READMEs, concatenated: about 100 KB of English and code."""
    paths = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "stages", "*", "README.md")))
    return "\n".join(open(path, encoding="utf-8").read() for path in paths if os.path.isfile(path))


def build_model(torch, vocab, args, attention):
    """A pre-norm transformer whose blocks call `block.attention(q, k, v)` on (B, H, N, D) tensors: a
    plain attribute, so a copy of the model can be given another attention function."""
    nn = torch.nn
    width = args.heads * args.head_dim

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = attention
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.query = nn.Linear(width, args.heads * args.head_dim, bias=False)
            self.key_value = nn.Linear(width, 2 * args.kv_heads * args.head_dim, bias=False)
            self.project = nn.Linear(width, width, bias=False)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x):
            batch, seq, _ = x.shape
            h = self.norm1(x)
            # (B, N, H, D) -> (B, H, N, D), made contiguous: the layout the op takes
            q = self.query(h).view(batch, seq, args.heads, args.head_dim).transpose(1, 2).contiguous()
            k, v = self.key_value(h).view(batch, seq, 2, args.kv_heads, args.head_dim).unbind(2)
            k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
            mixed = self.attention(q, k, v).transpose(1, 2).reshape(batch, seq, width)
            x = x + self.project(mixed)
            return x + self.mlp(self.norm2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.position = nn.Parameter(torch.zeros(args.seq, width))
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens) + self.position[: tokens.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return Model()


class Run:
    """One model, its optimizer, its losses and the GPU time of each training step."""

    def __init__(self, torch, name, model, args):
        self.torch, self.name = torch, name
        # the model's forward pass compiled; its backward pass, our op's included, is compiled with it
        self.model = torch.compile(model, fullgraph=True) if args.compile else model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        self.losses = []
        self.seconds = []

    def step(self, inputs, targets):
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        self.optimizer.step()
        end.record()
        end.synchronize()
        self.seconds.append(start.elapsed_time(end) / 1e3)
        self.losses.append(loss.item())


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as error:
        die(f"PyTorch is needed ({error}); run this on the GPU machine")
    if not torch.cuda.is_available():
        die(f"this example trains on a CUDA GPU (sm_80 or newer) and PyTorch {torch.__version__} sees none")
    try:
        import fa_course
    except ImportError as error:
        die(f"the fa_course package is not installed ({error}): pip install python/ (from the repository)")
    try:
        library = fa_course.load()
    except fa_course.LibraryNotFoundError as error:
        die(str(error))
    if args.heads % args.kv_heads:
        die(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    probe = torch.empty(1, args.heads, args.seq, args.head_dim, device="cuda", dtype=torch.bfloat16)
    probe_kv = torch.empty(1, args.kv_heads, args.seq, args.head_dim, device="cuda", dtype=torch.bfloat16)
    try:
        forward_stage, backward_stage = fa_course.chosen_stages(probe, probe_kv, probe_kv, causal=True,
                                                                stage=args.stage)
    except ValueError as error:
        die(str(error))

    def ours(q, k, v):
        return fa_course.attention(q, k, v, causal=True, stage=args.stage)

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    text = load_text()
    alphabet = sorted(set(text))
    code = {c: i for i, c in enumerate(alphabet)}
    data = torch.tensor([code[c] for c in text], dtype=torch.long, device="cuda")
    torch.manual_seed(args.seed)
    model = build_model(torch, len(alphabet), args, ours).cuda()
    twin = copy.deepcopy(model)  # the same weights
    for block in twin.blocks:
        block.attention = sdpa
    runs = [Run(torch, "fa_course", model, args), Run(torch, "sdpa", twin, args)]

    print(f"{torch.cuda.get_device_name()}; PyTorch {torch.__version__}; {library.path}; forward {forward_stage}, "
          f"backward {backward_stage}; {len(text)} characters, vocabulary {len(alphabet)}; {args.layers} layers, "
          f"{args.heads} query heads over {args.kv_heads} K/V heads of {args.head_dim}, causal, BF16 autocast"
          f"{', torch.compile(fullgraph=True)' if args.compile else ''}", flush=True)
    print(f"{'step':>6} {'loss fa_course':>15} {'loss sdpa':>10} {'difference':>11}", flush=True)
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), device="cuda", generator=generator)
        offsets = torch.arange(args.seq + 1, device="cuda")
        window = data[starts[:, None] + offsets[None, :]]
        for run in runs:
            run.step(window[:, :-1], window[:, 1:])
        if step % args.print_every == 0 or step == 1 or step == args.steps:
            a, b = runs[0].losses[-1], runs[1].losses[-1]
            print(f"{step:>6} {a:>15.4f} {b:>10.4f} {a - b:>+11.4f}", flush=True)

    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["step", "loss_fa_course", "loss_sdpa"])
            for step, (a, b) in enumerate(zip(runs[0].losses, runs[1].losses), start=1):
                writer.writerow([step, f"{a:.6f}", f"{b:.6f}"])
    tail = min(20, args.steps)
    final = [sum(run.losses[-tail:]) / tail for run in runs]
    warmup = min(args.steps - 1, max(1, args.steps // 10))  # compilation and first-call costs stay out
    tokens = (args.steps - warmup) * args.batch * args.seq
    for run, loss in zip(runs, final):
        print(f"{run.name:>10}: final loss {loss:.4f} (mean of the last {tail} steps), "
              f"{tokens / sum(run.seconds[warmup:]):,.0f} tokens/s (forward, backward and optimizer; steps after "
              f"the first {warmup})")
    relative = abs(final[0] - final[1]) / max(abs(final[1]), 1e-12)
    agree = relative <= args.agreement and all(math.isfinite(x) for x in final)
    print(f"final losses differ by {100 * relative:.2f} % ({'within' if agree else 'NOT within'} "
          f"{100 * args.agreement:.0f} %)")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
