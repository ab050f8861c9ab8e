#!/usr/bin/env python3
"""Stage 14's structural test on the machine code (SASS): every FP8 attention kernel runs both
products on the tensor cores in e4m3: S = Q·Kᵀ as QGMMA ... E4M3.E4M3 with both operands through
matrix descriptors (A from shared memory), O += P·V as QGMMA ... E4M3.E4M3 with P, its A operand,
in registers; and no 16-bit wgmma (HGMMA). Fails when a kernel misses either product, issues an
HGMMA, or when no kernel was found. Reads the SASS with sass_listing.py.

  sass_fp8_wgmma_check.py --ptxas PTXAS --ptx FILE --arch 90a [--root REPO]
"""
import re
import sys

from sass_listing import arguments, check_kernels

# QGMMA.64xNx32.F32.E4M3.E4M3 Rd, gdesc[URa], ...: A through a descriptor (S = Q·Kᵀ)
SCORES = re.compile(r"\bQGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, gdesc\[UR\d+\]")
# QGMMA.64xNx32.F32.E4M3.E4M3 Rd, Ra, gdesc[URb], ...: A from registers (O += P·V)
VALUES = re.compile(r"\bQGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc\[UR\d+\]")


def check(name, listing):
    scores = sum(SCORES.search(text) is not None for _, text in listing)
    values = sum(VALUES.search(text) is not None for _, text in listing)
    sixteen_bit = sum(re.search(r"\bHGMMA\b", text) is not None for _, text in listing)
    detail = (f"{scores} e4m3 QGMMA of S (A in shared memory), {values} of P·V (P in registers), "
              f"{sixteen_bit} HGMMA")
    return scores > 0 and values > 0 and sixteen_bit == 0, detail


def main():
    args = arguments("stage 14's products as e4m3 wgmma (QGMMA), in the SASS").parse_args()
    return check_kernels(args, lambda name, _: "fp8_attention_kernel" in name, check,
                         f"no fp8_attention_kernel in {args.ptx}")


if __name__ == "__main__":
    sys.exit(main())
