#!/usr/bin/env python3
"""Measured DRAM and L2 traffic of each GPU stage, beside what the FlashAttention paper predicts.

Runs every stage executable once under Nsight Compute,

  ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
      build/bin/NN_name --batch B --heads H --seq N --dim D --reps 0 --warmup 0 --no-check --csv ROW  (exactly one forward)

sums the metrics over the stage's kernels and writes traffic.csv in fa_course.bench.schema's
TRAFFIC_COLUMNS (stage, gpu, B, Hq, Hkv, Nq, Nk, D, dtype, causal, pass, dram_read_bytes,
dram_write_bytes, l2_bytes, predicted_bytes); dtype and gpu come from the row the stage itself
writes. The default shapes are two of the standard sweep, (4, 16, 4096, 128) and (1, 16, 16384,
128), so the timing of the same shapes (compare_torch.py --shapes seed001) gives the achieved FLOP/s
for the roofline: at both, the K and V of all heads (64 MiB and more in FP16) are larger than an
H100's 50 MB L2.

predicted_bytes follows the IO analysis of the FlashAttention paper (Dao et al. 2022), per query
head, e = bytes per element, M = shared memory per SM in elements (the `M` of the paper), and the
stage's facts from the C ABI library (fa_stage_kv_passes: K+V reads per query tile):
  FlashAttention-style stages:   e * (2*Nq*d + ceil(Nq/Br) * 2*kv_passes*Nk*d)
      Q read and O written once; K and V kv_passes times per block of Br = min(ceil(M/(4d)), d)
      query rows, so about 8*N^2*d^2/M for one pass: Theta(N^2 d^2 / M). kv_passes is 1 for
      FlashAttention (stages 04 and later), 2 for stage 03 (K three times and V once per query block)
  standard attention (Algorithm 0): e * (2*Nq*d + 2*Nk*d + 4*Nq*Nk)
      read Q, K; write S; read S, write P; read P, V; write O: Theta(N*d + N^2). The library has no
      fact that says a stage keeps S in global memory, so SCORES_IN_GLOBAL_MEMORY names those stages
      (stage 02) here.
The prediction counts DRAM traffic without any help from L2; the measured bytes show how much
the L2 cache saves when blocks that share K and V run at the same time.

  python3 scripts/traffic.py --bin build/bin --out plots/data/<gpu>/traffic.csv
"""

import argparse
import csv
import ctypes
import glob
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from fa_course import Problem, capi  # noqa: E402
from fa_course.bench import results  # noqa: E402
from fa_course.bench.schema import ELEMENT_BYTES  # noqa: E402
from fa_course.bench.shapes import parse_problem  # noqa: E402
from fa_course.selection import DECODE_STAGES  # noqa: E402

METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum"]
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
              "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "B": 1}
# The stages that write the whole score matrix S to global memory and read it back (standard
# attention, Algorithm 0 of the paper). The C ABI offers no fact for this (fa_stage_kv_passes
# describes the fused stages' K/V reads), so it is named here, by stage folder.
SCORES_IN_GLOBAL_MEMORY = {"02_naive_gpu"}
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81


def die(message):
    print(f"traffic: {message}", file=sys.stderr)
    sys.exit(2)


def find_ncu(explicit):
    if explicit:
        return explicit
    candidates = [shutil.which("ncu")] + sorted(glob.glob("/usr/local/cuda*/bin/ncu"), reverse=True) + \
        sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    die("Nsight Compute (ncu) not found: install it (nsight-compute) or pass --ncu PATH")


def shared_memory_per_sm():
    """Bytes of shared memory per SM of device 0, from the driver (no PyTorch needed)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        die(f"no NVIDIA driver (libcuda.so.1): {error}")
    device, value = ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
        die("the driver finds no CUDA device")
    if cuda.cuDeviceGetAttribute(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                                 device) != 0:
        die("cannot read the shared memory per SM; pass --smem-per-sm BYTES")
    return value.value


def predicted_bytes(stage, problem, element_bytes, smem_per_sm):
    """The paper's DRAM bytes for one forward pass of `problem` by `stage` (a capi.Stage): see the
    module docstring. Per query head; a grouped problem's query heads each read their K/V head."""
    q_seq, kv_seq, dim = problem.q_seq, problem.kv_seq, problem.dim
    if stage.folder in SCORES_IN_GLOBAL_MEMORY:
        per_head = 2 * q_seq * dim + 2 * kv_seq * dim + 4 * q_seq * kv_seq
    else:
        if stage.kv_passes is None:
            die(f"the library gives no kv_passes for {stage.id} (a C ABI version 1 build): rebuild fa_capi")
        m_elements = smem_per_sm // element_bytes
        block_rows = min(math.ceil(m_elements / (4 * dim)), dim)
        per_head = 2 * q_seq * dim + math.ceil(q_seq / block_rows) * round(2 * stage.kv_passes * kv_seq * dim)
    return problem.batch * problem.q_heads * per_head * element_bytes


def parse_ncu_csv(text, exclude):
    """Per-kernel metrics from `ncu --import R --csv --print-units base`. The details page has one
    row per (launch, metric) with "Metric Name", "Metric Unit", "Metric Value"; the raw page one
    row per launch with a column per metric (and a units row). Returns ({metric: total bytes},
    [(kernel, {metric: bytes})]) over the launches whose kernel name `exclude` does not match."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if not rows:
        return None, []
    header = rows[0]
    launches = {}  # launch ID -> (kernel, {metric: bytes})

    def add(launch, kernel, metric, unit, value):
        unit = unit.strip() or "byte"
        if unit not in BYTE_UNITS:
            die(f"unexpected unit '{unit}' for {metric}")
        values = launches.setdefault(launch, (kernel, {}))[1]
        values[metric] = float(value.replace(",", "")) * BYTE_UNITS[unit]

    kernel_column, id_column = header.index("Kernel Name"), header.index("ID")
    if "Metric Name" in header:
        name, unit, value = (header.index(c) for c in ("Metric Name", "Metric Unit", "Metric Value"))
        for row in rows[1:]:
            if row[name] in METRICS:
                add(row[id_column], row[kernel_column], row[name], row[unit], row[value])
    else:
        columns = {m: header.index(m) for m in METRICS if m in header}
        units = rows[1] if len(rows) > 1 and not rows[1][id_column].strip() else [""] * len(header)
        for row in rows[1:]:
            if row[id_column].strip():
                for metric, column in columns.items():
                    add(row[id_column], row[kernel_column], metric, units[column], row[column])
    kernels = []
    for kernel, values in launches.values():
        if exclude and re.search(exclude, kernel):
            print(f"      left out (--exclude-kernels): {kernel[:90]}")
        else:
            kernels.append((kernel, values))
    for kernel, values in kernels:
        missing = [m for m in METRICS if m not in values]
        if missing:
            die(f"ncu reported no {', '.join(missing)} for {kernel}")
    totals = {m: sum(values[m] for _, values in kernels) for m in METRICS}
    return totals, kernels


def profile(ncu, executable, problem, timeout, exclude, workdir):
    """Runs one stage under ncu; returns (harness row, totals, kernels) or None (printed why)."""
    name = os.path.basename(executable)
    label = f"{name} {problem.describe()}"
    report = os.path.join(workdir, f"{name}_{problem.spec()}")
    row_csv = os.path.join(workdir, f"{name}_{problem.spec()}.csv")
    shape_flags = ["--batch", str(problem.batch), "--heads", str(problem.q_heads), "--seq", str(problem.q_seq),
                   "--dim", str(problem.dim)]
    if problem.grouped:
        shape_flags += ["--kv-heads", str(problem.kv_heads)]
    if problem.rectangular:
        shape_flags += ["--seq-k", str(problem.kv_seq)]
    command = [ncu, "--clock-control", "none", "--metrics", ",".join(METRICS), "--target-processes", "all",
               "--force-overwrite", "--export", report, executable, *shape_flags, "--reps", "0", "--warmup", "0",
               "--no-check", "--csv", row_csv]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"  {label}: skipped, over {timeout} s under ncu")
        return None
    output = result.stdout + result.stderr
    if "ERR_NVGPUCTRPERM" in output:
        die("no permission for GPU performance counters (ERR_NVGPUCTRPERM): run as root or allow profiling")
    if result.returncode != 0 or not os.path.exists(report + ".ncu-rep"):
        print(f"  {label}: failed (exit {result.returncode}):\n" + "\n".join(output.splitlines()[-15:]))
        return None
    imported = subprocess.run([ncu, "--import", report + ".ncu-rep", "--csv", "--print-units", "base"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    totals, kernels = parse_ncu_csv(imported.stdout, exclude)
    if not kernels:
        print(f"  {label}: ncu profiled no kernel:\n" + "\n".join(output.splitlines()[-15:]))
        return None
    try:
        rows = results.read_results(row_csv, duplicates="last") if os.path.exists(row_csv) else []
    except results.SchemaError as error:
        die(f"{name} wrote a CSV that is not DESIGN.md's results schema: {error}")
    if not rows:
        print(f"  {label}: the stage wrote no CSV row")
        return None
    return rows[-1], totals, kernels


def default_library(bin_folder):
    """The library of the same build as the executables (<bin>/../lib/libfa_capi.so), else the usual
    search ($FA_CAPI_LIB, build*/lib/libfa_capi.so)."""
    beside = os.path.join(os.path.dirname(os.path.abspath(bin_folder)), "lib", capi.LIBRARY_NAME)
    return beside if os.path.isfile(beside) else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default="build/bin", help="folder of the stage executables (default: %(default)s)")
    parser.add_argument("--lib", help="the C ABI library, for the stages' facts (default: <bin>/../lib/libfa_capi.so, "
                                      "else $FA_CAPI_LIB or the newest build*/lib/libfa_capi.so)")
    parser.add_argument("--out", required=True, help="traffic CSV to write (replaced)")
    parser.add_argument("--stages", help="comma-separated stage ids or numbers (default: every GPU stage found)")
    parser.add_argument("--shapes", default="4x16x4096x128,1x16x16384x128",
                        help="comma-separated BxHxNxD or BxHqxHkvxNqxNkxD (default: %(default)s)")
    parser.add_argument("--ncu", help="path of ncu (default: found on PATH or under /usr/local/cuda*)")
    parser.add_argument("--smem-per-sm", type=int, help="bytes of shared memory per SM (default: asked of the driver)")
    parser.add_argument("--exclude-kernels", default="",
                        help="regex of kernel names that are not the stage's (harness kernels), left out of the sums")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per profiled run (default: %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=480, help="stop after this long (default: %(default)s)")
    args = parser.parse_args()

    problems = []
    for item in args.shapes.split(","):
        try:
            problems.append(parse_problem(item))
        except ValueError as error:
            die(f"bad shape: {error}")
    executables = sorted(p for p in glob.glob(os.path.join(args.bin, "[0-9][0-9]_*")) if os.access(p, os.X_OK))
    executables = [p for p in executables if not os.path.basename(p).endswith("_cpu")]
    if args.stages:
        wanted = [s.strip() for s in args.stages.split(",")]
        executables = [p for p in executables
                       if os.path.basename(p) in wanted or os.path.basename(p)[:2] in [w.zfill(2) for w in wanted]]
    if not executables:
        die(f"no GPU stage executables in {args.bin}")
    try:
        library = capi.Library(args.lib or default_library(args.bin))
    except capi.LibraryNotFoundError as error:
        die(f"the stages' facts (kv_passes) come from the C ABI library: {error}")
    facts = {}
    for executable in executables:
        folder = os.path.basename(executable)
        found = [s for s in library.stages() if s.folder == folder]
        if not found:
            die(f"{library.path} has no stage {folder}: use the library of the same build as {args.bin}")
        facts[folder] = found[0]
    # The traffic model is the forward pass's; a backward stage's forward is an earlier stage's kernel.
    backward_only = [f for f in facts if "backward" in facts[f].features]
    for folder in backward_only:
        print(f"  {folder}: left out (a backward stage: its forward is an earlier stage's kernel)")
        del facts[folder]
    # A decoding stage runs its own kernel only for a few query rows; at the model's square shapes it
    # hands the problem to an earlier stage's kernel, measured under that stage's name.
    for folder in [f for f in facts if f in DECODE_STAGES]:
        print(f"  {folder}: left out (a decoding stage: square shapes run an earlier stage's kernel)")
        del facts[folder]
    executables = [p for p in executables if os.path.basename(p) in facts]
    if not executables:
        die(f"no forward GPU stage executables in {args.bin}")
    ncu = find_ncu(args.ncu)
    smem = args.smem_per_sm or shared_memory_per_sm()
    print(f"ncu: {ncu}; shared memory per SM: {smem} bytes; library: {library.path}; stages (K+V passes): "
          + ", ".join(f"{f} ({'S in global memory' if f in SCORES_IN_GLOBAL_MEMORY else facts[f].kv_passes})"
                      for f in facts))

    started = time.monotonic()
    written, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="fa_traffic_") as workdir:
        for problem in problems:
            for executable in executables:
                stage = os.path.basename(executable)
                if time.monotonic() - started > args.max_seconds:
                    skipped.append(f"{stage} {problem.describe()}: past --max-seconds {args.max_seconds}")
                    continue
                result = profile(ncu, executable, problem, args.timeout, args.exclude_kernels, workdir)
                if result is None:
                    skipped.append(f"{stage} {problem.describe()}: see above")
                    continue
                row, totals, kernels = result
                if row.get("status") not in (None, "ok"):
                    skipped.append(f"{stage} {problem.describe()}: the stage reported {row.get('status')}: "
                                   f"{row.get('note')}")
                    continue
                dtype = row["dtype"]
                measured = Problem.from_row(row)
                if measured != problem:
                    die(f"{stage} ran {measured.describe()}, not {problem.describe()}: its command line changed?")
                predicted = predicted_bytes(facts[stage], problem, ELEMENT_BYTES[dtype], smem)
                written.append(results.make_row("traffic", stage=stage, gpu=row["gpu"], dtype=dtype,
                                                dram_read_bytes=int(totals[METRICS[0]]),
                                                dram_write_bytes=int(totals[METRICS[1]]),
                                                l2_bytes=int(totals[METRICS[2]]), predicted_bytes=predicted,
                                                **{"pass": "fwd"}, **problem.row_fields()))
                dram = totals[METRICS[0]] + totals[METRICS[1]]
                print(f"  {stage:<22} {problem.describe()} {dtype}: "
                      f"DRAM {dram / 1e9:.3f} GB (predicted {predicted / 1e9:.3f} GB), L2 "
                      f"{totals[METRICS[2]] / 1e9:.3f} GB over {len(kernels)} kernel(s)", flush=True)
                for kernel, values in kernels:
                    print(f"      {kernel[:90]}: DRAM read {values[METRICS[0]] / 1e9:.3f} GB, "
                          f"write {values[METRICS[1]] / 1e9:.3f} GB")

    results.write_traffic(args.out, written)
    print(f"{len(written)} rows written to {args.out} in {time.monotonic() - started:.0f} s")
    for line in skipped:
        print(f"  skipped: {line}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
