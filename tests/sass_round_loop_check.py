#!/usr/bin/env python3
"""A structural test on the machine code (SASS): in every kernel of a stage that issues wgmma and
computes exponentials, the round loop (the shortest loop that does both) moves nothing into a
uniform register (no R2UR). wgmma reads its matrix descriptors from uniform registers; where ptxas
cannot prove a descriptor the same across the warp it keeps it in ordinary registers and moves it
over before each wgmma, every round (stage 10's README, "The last round": a branch around the
epilogue cost 12 R2UR a round and 7 % at D = 64). Fails when a kernel's round loop holds an R2UR,
or when no kernel has a round loop. Reads the SASS with sass_listing.py.

  sass_round_loop_check.py --ptxas PTXAS --ptx FILE --arch 90a [--root REPO]
"""
import re
import sys

from sass_listing import arguments, check_kernels


def round_loop(listing):
    """The instructions of the shortest loop (a branch back to an earlier address) that holds both
    a wgmma (HGMMA, QGMMA) and an exponential (MUFU.EX2); None when there is none."""
    shortest = None
    for address, instruction in listing:
        target = re.search(r"\bBRA (0x[0-9a-f]+)", instruction)
        if not target or int(target.group(1), 16) >= address:
            continue
        body = [text for at, text in listing if int(target.group(1), 16) <= at <= address]
        if any("GMMA" in text for text in body) and any("MUFU.EX2" in text for text in body):
            if shortest is None or len(body) < len(shortest):
                shortest = body
    return shortest


def check(name, listing):
    body = round_loop(listing)
    if body is None:
        return False, "issues wgmma, but no loop does that and computes exponentials"
    moves = sum(re.search(r"\bR2UR\b", text) is not None for text in body)
    return moves == 0, f"{moves} R2UR in the round loop ({len(body)} instructions)"


def main():
    args = arguments("no R2UR in the round loop of a stage's wgmma kernels, in the SASS").parse_args()
    return check_kernels(args, lambda _, listing: any("GMMA" in text for _, text in listing), check,
                         f"no kernel with a round loop in {args.ptx}")


if __name__ == "__main__":
    sys.exit(main())
