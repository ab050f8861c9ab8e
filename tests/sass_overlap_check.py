#!/usr/bin/env python3
"""Stages 10's and 14's structural test on the machine code (SASS): in every kernel, a round's softmax
runs between the wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1: P·V may still run) and the wait for P·V
(WARPGROUP.DEPBAR.LE gsb0, 0x0). Reads the stage's SASS (sass_listing.py) and counts the MUFU.EX2
after each wait for S up to the next wait for P·V. Fails when a kernel has no such wait, or when the
count after every one of them is zero (ptxas hoisted the wait above the exponentials). The kernels of
the head dims named by --plain-dims run the round without the overlap (Tiling::kOverlap false): they
must wait for both products at once and never for S alone.

  sass_overlap_check.py --ptxas PTXAS --ptx FILE --arch 90a [--plain-dims 64] [--root REPO]
"""
import sys

from sass_listing import arguments, check_kernels


def check_round(name, listing, plain_dims):
    lines = [instruction for _, instruction in listing]
    if any(f"Li{dim}E" in name for dim in plain_dims):  # the kernel's head-dim template argument
        waits_for_s = sum("WARPGROUP.DEPBAR.LE gsb0, 0x1" in line for line in lines)
        waits_for_both = sum("WARPGROUP.DEPBAR.LE gsb0, 0x0" in line for line in lines)
        detail = f"plain round: {waits_for_s} waits for S alone, {waits_for_both} for both"
        return waits_for_s == 0 and waits_for_both > 0, detail
    counts = []
    inside = None
    for line in lines:
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            inside = 0
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line and inside is not None:
            counts.append(inside)
            inside = None
        elif "MUFU.EX2" in line and inside is not None:
            inside += 1
    detail = f"MUFU.EX2 between the wait for S and the wait for P·V: {counts or 'no such wait'}"
    return bool(counts) and max(counts) > 0, detail


def main():
    parser = arguments("stage 10's softmax between its two waits, in the SASS")
    parser.add_argument("--plain-dims", default="", help="comma-separated head dims whose kernels do not overlap")
    args = parser.parse_args()
    plain_dims = [int(dim) for dim in args.plain_dims.split(",") if dim]
    return check_kernels(args, lambda name, _: "attention_kernel" in name,
                         lambda name, listing: check_round(name, listing, plain_dims),
                         f"no attention kernel in {args.ptx}")


if __name__ == "__main__":
    sys.exit(main())
