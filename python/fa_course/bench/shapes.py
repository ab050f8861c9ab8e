"""The benchmarks' problems (fa_course.Problem): the names the benchmarks and READMEs use for sets of
them (presets) and their text form on command lines.

    >>> parse_problem("1x32x8x4x65536x128").describe()
    'B=1 Hq=32 Hkv=8 Nq=4 Nk=65536 D=128'
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Tuple

from ..problem import Problem


def _square(values: Iterable[Tuple[int, int, int, int]]) -> List[Problem]:
    return [Problem.square(*v) for v in values]


# The benchmark shapes by the names READMEs use (DESIGN.md, "Benchmarks, data, plots").
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
