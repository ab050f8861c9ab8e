"""The one measured table of a stage README, written from a GPU's data set by scripts/make_tables.py.

A stage README keeps one short table under its "## Measured" heading. For the stages in TABLES that
table is generated here, so that new rows reach the lesson by `python3 scripts/make_tables.py`, and a
table edited by hand fails `make_tables.py --check`; the prose around it is the author's. Each table
reads the rows of one run: the stage beside its peers on the same tensors in one process (torch.csv;
fp8.csv for stage 14). A ratio is the peer's time over ours: above 1, ours is faster. Needs nothing
beyond the standard library and this package (make_tables.py takes it from the checkout, no install).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List

from ..problem import Problem
from .results import read_results
from .shapes import PRESETS

TABLE_GPU = "NVIDIA_H200"  # the data set whose rows the stage READMEs show


class Rows:
    """The ok rows of one CSV of a data folder, by stage, problem, dtype and pass; a missing row is a
    ValueError that names it."""

    def __init__(self, path: Path):
        self.path = path
        self.rows = {(row["stage"], Problem.from_row(row), row["dtype"], row["pass"]): row
                     for row in (read_results(path) if path.exists() else []) if row["status"] == "ok"}

    def get(self, stage: str, problem: Problem, dtype: str, pass_: str = "fwd") -> dict:
        found = self.rows.get((stage, problem, dtype, pass_))
        if found is None:
            raise ValueError(f"{self.path.name} has no ok row of {stage} at {label(problem)}"
                             f"{', causal' if problem.causal else ''}, {dtype}, {pass_}")
        return found

    def ms(self, *args) -> float:
        return float(self.get(*args)["ms_median"])

    def tflops(self, *args) -> float:
        return float(self.get(*args)["tflops"])


def label(problem: Problem) -> str:
    """(B, H, N, D), with Hq/Hkv where the heads differ."""
    heads = problem.q_heads if problem.q_heads == problem.kv_heads else f"{problem.q_heads}/{problem.kv_heads}"
    return f"({problem.batch}, {heads}, {problem.q_seq}, {problem.dim})"


def row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def stage10(folder: Path) -> List[str]:
    """The standard sweep (D = 128, H = 16, B·N = 16384): TFLOP/s, then each peer's time over stage 10's (stage 09
    beside 10 is the README's table of the ideas one at a time, measured in one run of its own)."""
    rows = Rows(folder / "torch.csv")
    sweep = PRESETS["seed001"]
    ours = "10_overlap"

    def over(peer, causal=False):
        return [f"{rows.ms(peer, p.with_causal(causal), 'fp16') / rows.ms(ours, p.with_causal(causal), 'fp16'):.2f}"
                for p in sweep]

    lines = [row(["N"] + [str(p.q_seq) for p in sweep]), "|" + "---|" * (1 + len(sweep))]
    lines += [row([f"10, {dtype.upper()}"] + [f"{rows.tflops(ours, p, dtype):.1f}" for p in sweep])
              for dtype in ("fp16", "bf16")]
    return lines + [row(["over cuDNN, FP16"] + over("torch_cudnn")),
                    row(["over cuDNN, causal FP16"] + over("torch_cudnn", causal=True)),
                    row(["over PyTorch flash, FP16"] + over("torch_flash"))]


def stage13(folder: Path) -> List[str]:
    """The backward beside cuDNN's, FP16 and BF16, each shape without the mask and with it."""
    rows = Rows(folder / "torch.csv")
    shapes = [Problem.square(4, 16, 2048, 64), Problem.square(4, 16, 2048, 128), Problem.square(4, 16, 4096, 64),
              Problem.square(4, 16, 4096, 128), Problem.square(1, 16, 16384, 128), Problem.square(4, 16, 4096, 256),
              Problem(1, 32, 8, 4096, 4096, 128), Problem(1, 32, 1, 4096, 4096, 128)]
    ours = "13_wgmma_backward"
    columns = ["(B, H, N, D)", "mask", "ms", "FP16", "cuDNN", "13 / cuDNN", "BF16", "cuDNN", "13 / cuDNN"]
    lines = [row(columns), "|" + "---|" * len(columns)]
    for problem in (s.with_causal(causal) for s in shapes for causal in (False, True)):
        cells = [label(problem), "causal" if problem.causal else "-", f"{rows.ms(ours, problem, 'fp16', 'bwd'):.2f}"]
        for dtype in ("fp16", "bf16"):
            key = (problem, dtype, "bwd")
            cells += [f"{rows.tflops(ours, *key):.0f}", f"{rows.tflops('torch_cudnn', *key):.0f}",
                      f"{rows.ms('torch_cudnn', *key) / rows.ms(ours, *key):.2f}"]
        lines.append(row(cells))
    return lines


def stage14(folder: Path) -> List[str]:
    """FP8 attention, the kernel alone and end to end (quantization included), beside stage 10 in FP16
    and cuDNN's FP8 attention: TFLOP/s, FP16 in and out (fp8.csv)."""
    rows = Rows(folder / "fp8.csv")
    shapes = [Problem.square(4, 16, 4096, 128), Problem.square(2, 16, 8192, 128), Problem.square(1, 16, 16384, 128),
              Problem.square(4, 64, 8192, 128), Problem.square(4, 16, 4096, 128, causal=True),
              Problem.square(4, 16, 4096, 64), Problem.square(4, 16, 4096, 256)]
    columns = ["(B, H, N, D)", "attention", "end to end", "stage 10 FP16", "cuDNN FP8", "÷ stage 10", "÷ cuDNN FP8"]
    lines = [row(columns), "|" + "---|" * len(columns)]
    for problem in shapes:
        attention, end_to_end, fp16, cudnn = (rows.tflops(stage, problem, "fp16")
                                              for stage in ("14_fp8/attention", "14_fp8", "10_overlap", "cudnn_fp8"))
        lines.append(row([label(problem) + (" causal" if problem.causal else ""), f"{attention:.0f}",
                          f"{end_to_end:.0f}", f"{fp16:.0f}", f"{cudnn:.0f}", f"{attention / fp16:.2f}",
                          f"{attention / cudnn:.2f}"]))
    return lines


TABLES: Dict[str, Callable[[Path], List[str]]] = {"10_overlap": stage10, "13_wgmma_backward": stage13,
                                                   "14_fp8": stage14}


def rewrite(readme: str, table: List[str]) -> str:
    """`readme` with the first table under its "## Measured" heading replaced by `table` (its lines)."""
    lines = readme.split("\n")
    heading = next((i for i, line in enumerate(lines) if line.startswith("## Measured")), None)
    if heading is None:
        raise ValueError("it has no '## Measured' heading")
    first = next((i for i in range(heading + 1, len(lines)) if lines[i].startswith(("|", "## "))), None)
    if first is None or lines[first].startswith("## "):
        raise ValueError("it has no table under '## Measured'")
    last = first
    while last + 1 < len(lines) and lines[last + 1].startswith("|"):
        last += 1
    return "\n".join(lines[:first] + table + lines[last + 1:])


def stage_readmes(root: Path) -> Dict[str, str]:
    """{path relative to root: text} of every stage README whose measured table is generated; a README
    or a row that is not there raises ValueError with the path."""
    out = {}
    for stage, make in TABLES.items():
        path = f"stages/{stage}/README.md"
        try:
            out[path] = rewrite((root / path).read_text(), make(root / "plots" / "data" / TABLE_GPU))
        except ValueError as problem:
            raise ValueError(f"{path}: {problem}") from None
    return out
