"""Attention problems: the general (B, Hq, Hkv, Nq, Nk, D, causal) shape of design.md, the names the
benchmarks and READMEs use for sets of them (presets), and their text form on command lines.

    >>> Problem.square(4, 16, 4096, 128)
    Problem(batch=4, q_heads=16, kv_heads=16, q_seq=4096, kv_seq=4096, dim=128, causal=False)
    >>> parse_problem("1x32x8x4x65536x128").describe()
    'B=1 Hq=32 Hkv=8 Nq=4 Nk=65536 D=128'
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, Iterable, List, Tuple

from . import schema


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
        """The problem of a results or traffic row (schema.RESULTS_COLUMNS)."""
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

    # ---- the schema's counts -------------------------------------------------------------------
    def flops(self, pass_: str = "fwd") -> float:
        return schema.attention_flops(self.batch, self.q_heads, self.q_seq, self.kv_seq, self.dim, self.causal, pass_)

    def minimum_bytes(self, dtype: str, pass_: str = "fwd", with_lse: bool = False) -> int:
        return schema.minimum_bytes(self.batch, self.q_heads, self.kv_heads, self.q_seq, self.kv_seq, self.dim, dtype,
                                    pass_, with_lse)

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


def _square(values: Iterable[Tuple[int, int, int, int]]) -> List[Problem]:
    return [Problem.square(*v) for v in values]


# The benchmark shapes by the names READMEs use (design.md, "Benchmarks, data, plots").
PRESETS: Dict[str, List[Problem]] = {
    # the standard sweep: D = 128, H = 16, B·N = 16384 (and the same at D = 64)
    "seed001": _square([(32, 16, 512, 128), (16, 16, 1024, 128), (8, 16, 2048, 128), (4, 16, 4096, 128),
                        (2, 16, 8192, 128), (1, 16, 16384, 128)]),
    "seed001-d64": _square([(32, 16, 512, 64), (16, 16, 1024, 64), (8, 16, 2048, 64), (4, 16, 4096, 64),
                            (2, 16, 8192, 64), (1, 16, 16384, 64)]),
    # the standard sweep from N = 2048 at the other head dims of stage 08's issue (64, 96, 192, 256)
    "sweep-head-dims": _square([(16384 // n, 16, n, d) for d in (64, 96, 192, 256) for n in (2048, 4096, 8192, 16384)]),
    # the large-head shapes
    "seed004": _square([(1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128)]),
    # the sequence-length sweeps at B = H = 1, up to N = 2^17
    "sweep-d64": _square([(1, 1, 2**k, 64) for k in range(8, 18)]),
    "sweep-d128": _square([(1, 1, 2**k, 128) for k in range(8, 18)]),
    # a quick smoke test: N and D not multiples of any tile, and a D (100) that flash refuses
    "small": _square([(1, 1, 64, 64), (2, 3, 257, 72), (1, 2, 1000, 100)]),
    # grouped-query attention (8 query heads per key/value head) and multi-query attention
    "gqa": [Problem(4, 32, 8, 4096, 4096, 128)],
    "mqa": [Problem(4, 32, 1, 4096, 4096, 128)],
    # decoding: a few new queries against a long cache of keys and values
    "decode": [Problem(1, 32, 8, nq, nk, 128) for nk in (4096, 65536) for nq in (1, 4, 16)],
    # the decoding sweep of stage 12 (its issue): B in {1, 4, 16}, Nq in {1, 4, 16}, Nk from 4096 to 262144
    "decode-sweep": [Problem(b, 32, 8, nq, nk, 128) for b in (1, 4, 16) for nk in (4096, 16384, 65536, 262144)
                     for nq in (1, 4, 16)],
    # a quick smoke test of the general shapes: groups, Nq < Nk, Nq > Nk (with causal masking the
    # first Nq - Nk rows see no key), odd sizes
    "small-general": [Problem(1, 4, 2, 64, 100, 64), Problem(2, 6, 3, 33, 257, 72), Problem(1, 8, 1, 1, 1000, 128),
                      Problem(1, 2, 1, 100, 40, 64)],
}

_SPEC = re.compile(r"\d+(x\d+){3}|\d+(x\d+){5}")


def parse_problem(text: str) -> Problem:
    """'BxHxNxD' (square) or 'BxHqxHkvxNqxNkxD' (general), non-causal."""
    text = text.strip()
    if not _SPEC.fullmatch(text):
        raise ValueError(f"'{text}' is not BxHxNxD or BxHqxHkvxNqxNkxD")
    problem = Problem.of(int(x) for x in text.split("x"))
    reason = problem.validate()
    if reason:
        raise ValueError(f"'{text}': {reason}")
    return problem


def parse_shapes(items) -> List[Problem]:
    """Presets and shape specs, given as a list and/or separated by commas, in order."""
    if isinstance(items, str):
        items = [items]
    problems = []
    for item in (part.strip() for group in items for part in group.split(",")):
        if not item:
            continue
        if item in PRESETS:
            problems.extend(PRESETS[item])
        else:
            try:
                problems.append(parse_problem(item))
            except ValueError as error:
                raise ValueError(f"unknown shape '{item}': use a preset ({', '.join(PRESETS)}), BxHxNxD or "
                                 f"BxHqxHkvxNqxNkxD ({error})") from None
    return problems
