"""Which of the library's stages runs a forward pass that a backward pass can follow, and which runs
that backward pass: the choice fa_course.ops makes for every call, in plain Python (it asks the
library only what fa_stage_* and fa_workspace_bytes_v2 answer without a GPU), so it is tested
without PyTorch or a GPU.

The forward pass must write the log-sum-exp (the backward pass rebuilds P from it). Of the stages
that do, in the tensors' precision and on their device, the choice is the **latest in course
order that runs on this GPU and takes the problem**: each stage of the course is faster than the
one before it on the GPUs it runs on (09_wgmma_tma and 10_overlap on sm_90a only, 08_mma_registers
on any sm_80+ GPU). A backward stage (one with the backward feature) comes last: its forward pass is
an earlier stage's kernel under its own name (11_backward runs stage 08's), so it is taken only
when no forward stage takes the problem. The backward pass is the latest backward stage that runs
and takes the problem. Either may be named instead (`requested`): a stage id, folder or number, as
Library.select takes them ("09", "10_overlap", "08_mma_registers/bf16"); the descriptor of the
tensors' precision is taken.

A decoding stage (12_split_kv) runs its own kernels only below a number of query rows (Nq < 64)
and hands longer problems to stage 08's kernel under its own name: for those it ranks last, so a
prefill problem on sm_90a still gets 10_overlap.
"""

from __future__ import annotations

import functools
from typing import List, Optional, Tuple

from .capi import FaError, Library, Stage
from .problem import Problem


class UnsupportedProblem(ValueError):
    """No stage (or not the named one) runs this problem here; the message gives each stage's reason,
    the library's own where it refused."""


def runs_on(stage: Stage, backend: str, capability: int) -> str:
    """'' when `stage` runs on this device (backend 'cuda' with compute capability `capability`, e.g.
    90, or 'cpu'), else why not. 'sm_90a' stages need exactly that architecture, 'sm_80+' that one or
    newer (fa_stage_architecture)."""
    if stage.backend != backend:
        return f"{stage.id} runs on the {stage.backend.upper()}, the tensors are on the {backend.upper()}"
    if backend == "cpu":
        return ""
    exact = not stage.architecture.endswith("+")
    needed = stage.min_compute_capability
    if (capability != needed) if exact else (capability < needed):
        return (f"{stage.id} needs {stage.architecture}; this GPU is sm_{capability}")
    return ""


def _refusal(library: Library, stage: Stage, problem: Problem, pass_: str) -> str:
    """'' when the library takes `problem` for this pass of `stage` (with the LSE for a forward pass),
    else the library's reason."""
    if pass_ == "fwd" and not stage.supports("lse"):
        return f"{stage.id} does not write the log-sum-exp the backward pass needs"
    if pass_ == "bwd" and not stage.supports("backward"):
        return f"{stage.id} has no backward pass"
    try:
        library.workspace_bytes(stage.id, problem, pass_)
    except FaError as error:
        return error.message
    return ""


def _candidates(library: Library, backend: str, precision: str, pass_: str) -> List[Stage]:
    """The stages of this backend and precision in the order of preference described above."""
    own = [s for s in library.stages() if s.backend == backend and s.precision == precision]
    latest_first = list(reversed(own))
    if pass_ == "bwd":
        return [s for s in latest_first if s.supports("backward")]
    return ([s for s in latest_first if s.supports("lse") and not s.supports("backward")]
            + [s for s in latest_first if s.supports("lse") and s.supports("backward")])


def _named(library: Library, requested: str, backend: str, precision: str) -> List[Stage]:
    try:
        named = library.select(requested)
    except FaError as error:
        raise UnsupportedProblem(error.message) from None
    matching = [s for s in named if s.backend == backend and s.precision == precision]
    if not matching:
        found = ", ".join(f"{s.id} ({s.backend}, {s.precision})" for s in named)
        raise UnsupportedProblem(f"stage '{requested}' has no {backend} descriptor in {precision} (it has: {found})")
    return matching


# Decoding stages and the query rows from which they hand a problem to an earlier stage's kernel.
DECODE_STAGES = {"12_split_kv": 64}


def _decoding_last(candidates: List[Stage], problem: Problem) -> List[Stage]:
    """`candidates` with the decoding stages that would not run their own kernel on `problem` moved last."""
    def own_kernel(stage: Stage) -> bool:
        threshold = DECODE_STAGES.get(stage.id.split("/")[0])
        return threshold is None or problem.q_seq < threshold
    return [s for s in candidates if own_kernel(s)] + [s for s in candidates if not own_kernel(s)]


@functools.lru_cache(maxsize=256)
def choose_stage(library: Library, pass_: str, backend: str, precision: str, problem: Problem, capability: int,
                 requested: Optional[str] = None) -> Stage:
    """The stage that runs `pass_` ('fwd' or 'bwd') of `problem` on tensors of `precision` ('fp32',
    'fp16', 'bf16') on `backend` ('cuda', with compute capability `capability`; or 'cpu'), or the one
    `requested`. UnsupportedProblem, with every candidate's reason, when none does."""
    candidates = _named(library, requested, backend, precision) if requested else \
        _decoding_last(_candidates(library, backend, precision, pass_), problem)
    reasons: List[Tuple[str, str]] = []
    for stage in candidates:
        reason = runs_on(stage, backend, capability) or _refusal(library, stage, problem, pass_)
        if not reason:
            return stage
        reasons.append((stage.id, reason))
    what = "backward" if pass_ == "bwd" else "forward (with the log-sum-exp)"
    if not reasons:
        raise UnsupportedProblem(f"{library.path} has no {backend} stage with a {what} pass in {precision}")
    listed = "; ".join(reason if reason.startswith(stage_id) or stage_id in reason else f"{stage_id}: {reason}"
                       for stage_id, reason in reasons)
    raise UnsupportedProblem(f"no stage runs the {what} pass of {problem.describe()} in {precision} here: {listed}")


__all__ = ["UnsupportedProblem", "choose_stage", "runs_on"]
