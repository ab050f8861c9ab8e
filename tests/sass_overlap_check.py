#!/usr/bin/env python3
"""Stage 10's structural test on the machine code (SASS): in every kernel, a round's softmax runs
between the wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1: P·V may still run) and the wait for P·V
(WARPGROUP.DEPBAR.LE gsb0, 0x0). Assembles the stage's PTX with ptxas, disassembles it with
cuobjdump (PyPI: nvidia-cuda-cuobjdump with nvidia-cuda-nvdisasm, in requirements.txt), and counts the MUFU.EX2 after each
wait for S up to the next wait for P·V. Fails when a kernel has no such wait, or when the count
after every one of them is zero (ptxas hoisted the wait above the exponentials). The kernels of the
head dims named by --plain-dims run the round without the overlap (Tiling::kOverlap false): they
must wait for both products at once and never for S alone.

  sass_overlap_check.py --ptxas PTXAS --ptx FILE --arch 90a [--plain-dims 64] [--root REPO]
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile


def find_cuobjdump(ptxas, root):
    candidates = [os.environ.get("FA_CUOBJDUMP", ""), shutil.which("cuobjdump") or "",
                  os.path.join(os.path.dirname(ptxas), "cuobjdump")]
    # nvidia-cuda-cuobjdump puts it in site-packages/nvidia/cu<major>/bin (this Python's, or the
    # course's .venv made by scripts/lib/setup.sh from requirements.txt).
    for base in sys.path + glob.glob(os.path.join(root, ".venv", "lib", "python*", "site-packages")):
        candidates += glob.glob(os.path.join(base, "nvidia", "*", "bin", "cuobjdump"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ptxas", required=True)
    parser.add_argument("--ptx", required=True)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--plain-dims", default="", help="comma-separated head dims whose kernels do not overlap")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    cuobjdump = find_cuobjdump(args.ptxas, args.root)
    if cuobjdump is None:
        print("cuobjdump not found: pip install nvidia-cuda-cuobjdump (requirements.txt), or set FA_CUOBJDUMP")
        return 1
    with tempfile.TemporaryDirectory() as work:
        cubin = os.path.join(work, "stage.cubin")
        subprocess.run([args.ptxas, f"-arch=sm_{args.arch}", args.ptx, "-o", cubin], check=True)
        listing = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True)
    if listing.returncode != 0:
        # cuobjdump -sass runs nvdisasm (PyPI: nvidia-cuda-nvdisasm, in requirements.txt)
        print(f"{cuobjdump} -sass failed: {listing.stderr.strip()}")
        return 1
    sass = listing.stdout
    kernels = {}
    name = None
    for line in sass.splitlines():
        match = re.match(r"\s+Function : (\S+)", line)
        if match:
            name = match.group(1)
            kernels[name] = []
        elif name and re.search(r"/\*[0-9a-f]{4}\*/", line):
            kernels[name].append(line)
    plain_dims = [int(dim) for dim in args.plain_dims.split(",") if dim]
    checked = 0
    failed = False
    for name, lines in kernels.items():
        if "attention_kernel" not in name:
            continue
        checked += 1
        if any(f"Li{dim}E" in name for dim in plain_dims):  # the kernel's head-dim template argument
            waits_for_s = sum("WARPGROUP.DEPBAR.LE gsb0, 0x1" in line for line in lines)
            waits_for_both = sum("WARPGROUP.DEPBAR.LE gsb0, 0x0" in line for line in lines)
            verdict = "ok" if waits_for_s == 0 and waits_for_both > 0 else "FAILED"
            failed |= verdict != "ok"
            print(f"{verdict}: {name}: plain round: {waits_for_s} waits for S alone, {waits_for_both} for both")
            continue
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
        verdict = "ok" if counts and max(counts) > 0 else "FAILED"
        failed |= verdict != "ok"
        print(f"{verdict}: {name}: MUFU.EX2 between the wait for S and the wait for P·V: {counts or 'no such wait'}")
    if checked == 0:
        print(f"no attention kernel in {args.ptx}")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
