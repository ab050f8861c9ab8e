"""An attention problem: the general (B, Hq, Hkv, Nq, Nk, D, causal) shape of DESIGN.md, its text
form, and what it costs (the FLOP and byte counts every results row is computed from, written
once here); what the library's calls take and what fa_course.attention derives from its tensors.

    >>> Problem.square(4, 16, 4096, 128)
    Problem(batch=4, q_heads=16, kv_heads=16, q_seq=4096, kv_seq=4096, dim=128, causal=False)
    >>> Problem(1, 32, 8, 4, 65536, 128).describe()
    'B=1 Hq=32 Hkv=8 Nq=4 Nk=65536 D=128'
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

# bytes per element of each precision
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def causal_key_end(row, q_seq, kv_seq):
    """Keys [0, end) that query row `row` sees under the bottom-right-aligned causal mask
    (common/include/fa/causal.hpp)."""
    return max(0, min(kv_seq, row + 1 + kv_seq - q_seq))


def attention_pairs(q_seq, kv_seq, causal):
    """(query, key) pairs that count: Nq·Nk; causal, Nq·Nk/2 for a square problem (the published
    convention) and the exact number of unmasked pairs otherwise."""
    if not causal:
        return q_seq * kv_seq
    if q_seq == kv_seq:
        return q_seq * kv_seq / 2
    # Rows from max(0, Nq - Nk) on see start, start + 1, ... keys (never past Nk: the last row
    # sees exactly Nk): the sum of causal_key_end in closed form.
    seeing_rows = min(q_seq, kv_seq)
    start = causal_key_end(q_seq - seeing_rows, q_seq, kv_seq)
    return seeing_rows * start + seeing_rows * (seeing_rows - 1) // 2


def attention_flops(batch, q_heads, q_seq, kv_seq, dim, causal, pass_="fwd"):
    """Forward 4·B·Hq·pairs·D; backward 2.5 times that; fwd+bwd 3.5 times."""
    forward = 4.0 * batch * q_heads * attention_pairs(q_seq, kv_seq, causal) * dim
    return {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[pass_] * forward


def minimum_bytes(batch, q_heads, kv_heads, q_seq, kv_seq, dim, dtype, pass_="fwd", with_lse=False):
    """The fewest bytes any implementation moves (common/src/problem.cpp): forward reads Q, K, V
    and writes O (and the FP32 LSE when asked); backward reads Q, K, V, O, dO, LSE and writes dQ,
    dK, dV."""
    width = ELEMENT_BYTES[dtype]
    q_bytes = batch * q_heads * q_seq * dim * width
    kv_bytes = batch * kv_heads * kv_seq * dim * width
    lse_bytes = batch * q_heads * q_seq * 4
    forward = 2 * q_bytes + 2 * kv_bytes + (lse_bytes if with_lse else 0)
    backward = 4 * q_bytes + 4 * kv_bytes + lse_bytes
    return {"fwd": forward, "bwd": backward, "fwd+bwd": forward + backward}[pass_]


@dataclasses.dataclass(frozen=True)
class Problem:
    """Q and O are (batch, q_heads, q_seq, dim); K and V (batch, kv_heads, kv_seq, dim); q_heads is a
    multiple of kv_heads (query head h reads key/value head h // (q_heads // kv_heads)). With
    `causal`, query i sees keys 0 .. i + kv_seq - q_seq (bottom-right aligned)."""

    batch: int
    q_heads: int
    kv_heads: int
    q_seq: int
    kv_seq: int
    dim: int
    causal: bool = False

    @classmethod
    def square(cls, batch: int, heads: int, seq: int, dim: int, causal: bool = False) -> "Problem":
        """The (B, H, N, D) problem of the first part of the course."""
        return cls(batch, heads, heads, seq, seq, dim, causal)

    @classmethod
    def of(cls, value, causal: bool = None) -> "Problem":
        """A Problem from a Problem, a (B, H, N, D) tuple or a (B, Hq, Hkv, Nq, Nk, D) tuple; `causal`
        (when given) replaces the problem's own flag."""
        if isinstance(value, Problem):
            problem = value
        else:
            values = tuple(int(x) for x in value)
            if len(values) == 4:
                problem = cls.square(*values)
            elif len(values) == 6:
                problem = cls(*values)
            else:
                raise ValueError(f"a problem is (B, H, N, D) or (B, Hq, Hkv, Nq, Nk, D), not {value!r}")
        return problem if causal is None else dataclasses.replace(problem, causal=bool(causal))

    @classmethod
    def from_row(cls, row: dict) -> "Problem":
        """The problem of a results or traffic row (fa_course.bench.schema.RESULTS_COLUMNS)."""
        return cls(int(row["B"]), int(row["Hq"]), int(row["Hkv"]), int(row["Nq"]), int(row["Nk"]), int(row["D"]),
                   bool(int(row["causal"])))

    def with_causal(self, causal: bool) -> "Problem":
        return dataclasses.replace(self, causal=bool(causal))

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def grouped(self) -> bool:
        return self.q_heads != self.kv_heads

    @property
    def rectangular(self) -> bool:
        return self.q_seq != self.kv_seq

    @property
    def is_square(self) -> bool:
        return not self.grouped and not self.rectangular

    @property
    def q_shape(self) -> Tuple[int, int, int, int]:
        """Of Q and O."""
        return (self.batch, self.q_heads, self.q_seq, self.dim)

    @property
    def kv_shape(self) -> Tuple[int, int, int, int]:
        """Of K and V."""
        return (self.batch, self.kv_heads, self.kv_seq, self.dim)

    @property
    def lse_shape(self) -> Tuple[int, int, int]:
        return (self.batch, self.q_heads, self.q_seq)

    def kv_head_of(self, q_head: int) -> int:
        """The key/value head that query head `q_head` (within one batch entry) reads."""
        return q_head // self.group_size

    def validate(self) -> str:
        """'' when the sizes make a problem, else one line that says what is wrong (the library
        checks its own limits too)."""
        for name in ("batch", "q_heads", "kv_heads", "q_seq", "kv_seq", "dim"):
            if getattr(self, name) < 1:
                return f"{name} = {getattr(self, name)}: every size must be at least 1"
        if self.q_heads % self.kv_heads:
            return f"q_heads = {self.q_heads} is not a multiple of kv_heads = {self.kv_heads}"
        return ""

    # ---- the counts of a results row --------------------------------------------------------------
    def flops(self, pass_: str = "fwd") -> float:
        return attention_flops(self.batch, self.q_heads, self.q_seq, self.kv_seq, self.dim, self.causal, pass_)

    def minimum_bytes(self, dtype: str, pass_: str = "fwd", with_lse: bool = False) -> int:
        return minimum_bytes(self.batch, self.q_heads, self.kv_heads, self.q_seq, self.kv_seq, self.dim, dtype, pass_,
                             with_lse)

    def row_fields(self) -> Dict[str, int]:
        """The shape columns of a results row."""
        return {"B": self.batch, "Hq": self.q_heads, "Hkv": self.kv_heads, "Nq": self.q_seq, "Nk": self.kv_seq,
                "D": self.dim, "causal": int(self.causal)}

    # ---- text ------------------------------------------------------------------------------------
    def describe(self) -> str:
        """'B=4 H=16 N=4096 D=128' for a square problem, 'B=1 Hq=32 Hkv=8 Nq=4 Nk=65536 D=128'
        otherwise (common/include/fa/problem.hpp's describe), ' causal' appended when set."""
        if self.is_square:
            text = f"B={self.batch} H={self.q_heads} N={self.q_seq} D={self.dim}"
        else:
            text = (f"B={self.batch} Hq={self.q_heads} Hkv={self.kv_heads} Nq={self.q_seq} Nk={self.kv_seq} "
                    f"D={self.dim}")
        return text + (" causal" if self.causal else "")

    def spec(self) -> str:
        """The command-line form parse_problem reads back: BxHxNxD or BxHqxHkvxNqxNkxD."""
        if self.is_square:
            return f"{self.batch}x{self.q_heads}x{self.q_seq}x{self.dim}"
        return f"{self.batch}x{self.q_heads}x{self.kv_heads}x{self.q_seq}x{self.kv_seq}x{self.dim}"


__all__ = ["Problem", "ELEMENT_BYTES", "attention_flops", "attention_pairs", "causal_key_end", "minimum_bytes"]
