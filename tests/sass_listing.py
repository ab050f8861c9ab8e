"""The machine code (SASS) of a stage, for the structural tests that read it: the stage's PTX
assembled with ptxas, the cubin disassembled with cuobjdump (PyPI: nvidia-cuda-cuobjdump with
nvidia-cuda-nvdisasm, in requirements.txt), split by kernel into (address, instruction) pairs.
Used by sass_overlap_check.py, sass_round_loop_check.py and sass_fp8_wgmma_check.py; `arguments`
gives their common options (--ptxas PTXAS --ptx FILE --arch 90a [--root REPO]), `check_kernels` runs
a check on each kernel and gives the verdict."""
import argparse
import importlib.util
import os
import re
import subprocess
import tempfile


def _load_finder():
    """find_cuobjdump from python/fa_course/bench/cuobjdump.py, loaded by its path: importing the
    package would import its op (and PyTorch where it is installed)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "fa_course", "bench",
                        "cuobjdump.py")
    spec = importlib.util.spec_from_file_location("fa_course_cuobjdump", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find_cuobjdump


find_cuobjdump = _load_finder()


def arguments(description):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ptxas", required=True)
    parser.add_argument("--ptx", required=True)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return parser


def kernel_listings(args):
    """{kernel name: [(address, instruction), ...]}, or None after printing why there is none."""
    cuobjdump = find_cuobjdump(args.root, args.ptxas)
    if cuobjdump is None:
        print("cuobjdump not found: pip install nvidia-cuda-cuobjdump (requirements.txt), or set FA_CUOBJDUMP")
        return None
    with tempfile.TemporaryDirectory() as work:
        cubin = os.path.join(work, "stage.cubin")
        subprocess.run([args.ptxas, f"-arch=sm_{args.arch}", args.ptx, "-o", cubin], check=True)
        listing = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True)
    if listing.returncode != 0:
        # cuobjdump -sass runs nvdisasm (PyPI: nvidia-cuda-nvdisasm, in requirements.txt)
        print(f"{cuobjdump} -sass failed: {listing.stderr.strip()}")
        return None
    kernels = {}
    name = None
    for line in listing.stdout.splitlines():
        match = re.match(r"\s+Function : (\S+)", line)
        if match:
            name = match.group(1)
            kernels[name] = []
            continue
        match = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if name and match:
            kernels[name].append((int(match.group(1), 16), match.group(2)))
    return kernels


def check_kernels(args, wanted, check, nothing_checked):
    """A check's verdict over a stage's kernels: `check(name, listing)` gives (passed, detail) for
    each kernel that `wanted(name, listing)` selects, printed as "ok: <name>: <detail>" or
    "FAILED: ...". Returns the exit status: 1 when a kernel failed, when there is no listing, or
    when none was selected (then it prints `nothing_checked`); else 0."""
    kernels = kernel_listings(args)
    if kernels is None:
        return 1
    checked = 0
    failed = False
    for name, listing in kernels.items():
        if not wanted(name, listing):
            continue
        checked += 1
        passed, detail = check(name, listing)
        failed |= not passed
        print(f"{'ok' if passed else 'FAILED'}: {name}: {detail}")
    if checked == 0:
        print(nothing_checked)
        return 1
    return 1 if failed else 0
